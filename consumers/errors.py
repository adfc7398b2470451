"""What a handler raises to say how its attempt ended, and what it may see raised."""

from __future__ import annotations

from datetime import timedelta

from hybrid_jobs.consumers.outcome import MAX_RETRY_DELAY


class Retry(Exception):
    """Try again later: after ``delay`` (seconds or a timedelta), else the handler's
    backoff. The attempt counts; once the job's attempts are spent it ends FAILED."""

    code = "RETRY"

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and not 0 <= delay <= MAX_RETRY_DELAY:
            raise ValueError("Retry delay must be between 0 seconds and a year")
        self.delay = delay


class Permanent(Exception):
    """Fail the job now, whatever attempts are left: retrying cannot help (bad input,
    a declined card). ``code`` becomes the job's ``last_error_code``."""

    def __init__(self, message: str = "", *, code: str = "PERMANENT") -> None:
        super().__init__(message or code)
        self.code = code


class Cancel(Exception):
    """Stop and end the job CANCELLED: raise it after seeing ``job.cancel_requested``
    (and recording whatever partial effects matter)."""

    code = "CANCELLED"


class LeaseLost(Exception):
    """This worker no longer holds the job: its lease expired and the job was taken
    over, or it finished another way. Raised by ``job.transaction()`` when the fenced
    completion matches nothing; the transaction, and the handler's writes in it, were
    rolled back. A handler need not catch it."""
