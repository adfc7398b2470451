"""A TCP proxy the tests put between a process and PostgreSQL or RabbitMQ, to cut
connections and refuse new ones without touching the shared service (the way
aio-pika's own tests exercise reconnects)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``down()`` drops everything.

    Runs its own event loop in a thread so a test can use it from sync or async code
    and from subprocesses pointed at ``port``.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # Connections accepted so far (a test can count how often a client connects).
        self.connections = 0
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.up()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def up(self) -> None:
        """Accept connections again."""
        if self._server is None:
            self._server = self._call(self._start())

    def down(self) -> None:
        """Close every proxied connection and refuse new ones."""
        self._call(self._stop())

    def cut(self) -> None:
        """Close every proxied connection but keep accepting new ones."""
        self._call(self._close_all())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        await self._close_all()

    async def _close_all(self) -> None:
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except Exception:
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
