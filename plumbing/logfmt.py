"""One structured line per event: JSON objects on stderr.

Call sites log an event name and its fields::

    log.info("relay.published", extra={"count": 500, "queue": "default"})

and get ``{"ts": "...", "level": "info", "logger": "relay", "event":
"relay.published", "count": 500, "queue": "default"}``. URLs are only ever logged
through their ``redacted()`` form, so no credential reaches a log line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            line["error_type"] = record.exc_info[0].__name__
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The libraries' own chatter (every reconnect attempt, every pool resize) is
    # summarised by our events; keep theirs to warnings.
    for noisy in ("aio_pika", "aiormq", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # aiormq logs every failed connect at ERROR, before raising it to the caller,
    # who reports it (once, diagnosed, rate-limited): a second line per attempt is
    # the noise that hid a wrong URL among its retries.
    logging.getLogger("aiormq.connection").addFilter(_drop_transport_errors)


def _drop_transport_errors(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("error when creating transport")


def describe_error(exc: BaseException) -> str:
    """A one-line description of an exception: its type and first line (never
    raises, whatever the exception's ``__str__`` does)."""
    try:
        text = str(exc).strip().splitlines()
    except Exception:
        text = []
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
