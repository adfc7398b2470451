"""A webhook receiver on 127.0.0.1 for tests: it answers each request as told
(a status, or hang until released), and keeps what it was sent."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A request body larger than this is refused: the relay sends a few hundred bytes.
MAX_BODY = 64 * 1024
# How long a hanging request waits for release at most (the test ends before).
HANG_LIMIT = 300.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # monotonic

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signature_valid(self, secret: bytes, tolerance: float = 300) -> bool:
        """What a receiver checks: the HMAC of "<t>.<body>" under the secret, with a
        timestamp close to now."""
        parts = dict(p.split("=", 1) for p in self.headers["webhook-signature"].split(","))
        timestamp = int(parts["t"])
        expected = hmac.new(
            secret, f"{timestamp}.".encode() + self.body, hashlib.sha256
        ).hexdigest()
        return (
            hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - timestamp) < tolerance
        )


@dataclass
class Receiver:
    """``answers``: per path, the answers to its next requests in order (an int
    status, or "hang"); then ``default``."""

    answers: dict[str, list[int | str]] = field(default_factory=dict)
    default: int | str = 200
    received: list[Received] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    most_in_flight: dict[str, int] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def _answer(self, path: str) -> int | str:
        with self.lock:
            queued = self.answers.get(path)
            return queued.pop(0) if queued else self.default


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            if length > MAX_BODY:
                self.send_error(413)
                return
            body = self.rfile.read(length)
            path = self.path
            with receiver.lock:
                receiver.received.append(
                    Received(
                        path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.monotonic(),
                    )
                )
                now = receiver.in_flight.get(path, 0) + 1
                receiver.in_flight[path] = now
                receiver.most_in_flight[path] = max(receiver.most_in_flight.get(path, 0), now)
            try:
                answer = receiver._answer(path)
                if answer == "hang":
                    receiver.release.wait(HANG_LIMIT)
                    answer = 200
                self.send_response(int(answer))
                self.send_header("Content-Length", "0")
                self.end_headers()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the caller gave up on us: what a hanging endpoint sees
            finally:
                with receiver.lock:
                    receiver.in_flight[path] -= 1

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def receiving(**kwargs: Any) -> Iterator[Receiver]:
    """A receiver serving on a port of its own until the block ends (hanging
    requests are released then)."""
    receiver = Receiver(**kwargs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()
