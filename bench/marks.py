"""The side channel between a benchmark and the worker processes it starts (our
consumers running `bench.apps` or a benchmark's own app, and the peers of
`bench.compare`): each worker process appends to files of its own in one directory,
named by ``BENCH_MARKS_DIR``, and the benchmark reads the directory back. Appending a
few bytes costs a write(2) per job (microseconds), far below any queue's per-job cost,
and needs nothing from the system being measured: no result backend, no extra table,
no extra round trip.

Per worker process (pid):

- ``{pid}.txt``: one ``job_id unix_time`` line when a latency job's handler starts;
- ``{pid}.end``: likewise when a handler that notes its end returns;
- ``{pid}.done``: one byte per finished no-op job (the benchmark sums file sizes);
- ``{pid}.first``: the time the process started its first no-op job;
- ``{pid}.ready``: one byte per warm-up job, so the benchmark knows which workers run;
- ``{pid}.hops``: one ``hop unix_time job_id ...`` line each time a wake-up passes a
  hop (``notified``, ``sent``, ``delivered``, ``claimed``), written only by a worker
  started with ``BENCH_HOPS`` set: `bench.latency` splits the floor's start by them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ENV = "BENCH_MARKS_DIR"
# Set (to anything) for a worker to note each hop of a wake-up (Marks.hop).
HOPS_ENV = "BENCH_HOPS"


class Marks:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fds: dict[str, int] = {}
        self._first_noted = False

    @classmethod
    def from_env(cls) -> Marks:
        return cls(Path(os.environ[ENV]))

    # Worker side: each call is one append to this process's own file.

    def _append(self, suffix: str, data: bytes) -> None:
        fd = self._fds.get(suffix)
        if fd is None:
            fd = os.open(
                self.path / f"{os.getpid()}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
            self._fds[suffix] = fd
        os.write(fd, data)

    def started(self, job_id: object) -> None:
        self._append("txt", f"{job_id} {time.time()}\n".encode())

    def ended(self, job_id: object) -> None:
        self._append("end", f"{job_id} {time.time()}\n".encode())

    def done(self, count: int = 1) -> None:
        if not self._first_noted:
            self._first_noted = True
            self._append("first", f"{time.time()}\n".encode())
        self._append("done", b"." * count)

    def ready(self) -> None:
        self._append("ready", b".")

    def hop(self, name: str, job_ids: Iterable[object] = ()) -> None:
        """The wake-up of ``job_ids`` (none: a NOTIFY, which names no job) passed
        the hop ``name`` now."""
        ids = "".join(f" {job_id}" for job_id in job_ids)
        self._append("hops", f"{name} {time.time()}{ids}\n".encode())

    # Benchmark side.

    def _sizes(self, suffix: str) -> dict[str, int]:
        return {p.stem: p.stat().st_size for p in self.path.glob(f"*.{suffix}")}

    def done_count(self) -> int:
        return sum(self._sizes("done").values())

    def ready_count(self) -> int:
        return sum(self._sizes("ready").values())

    def ready_workers(self) -> int:
        return sum(1 for size in self._sizes("ready").values() if size)

    def first_start(self) -> float:
        """The earliest moment any worker started a no-op job."""
        return min(float(p.read_text().split()[0]) for p in self.path.glob("*.first"))

    def _times(self, suffix: str) -> dict[str, float]:
        """Each job's first time noted in the ``suffix`` files, by job id."""
        noted: dict[str, float] = {}
        for path in self.path.glob(f"*.{suffix}"):
            for line in path.read_text().splitlines():
                job_id, at = line.split()
                noted.setdefault(job_id, float(at))
        return noted

    def starts(self) -> dict[str, float]:
        return self._times("txt")

    def ends(self) -> dict[str, float]:
        return self._times("end")

    def start_count(self) -> int:
        return sum(p.read_bytes().count(b"\n") for p in self.path.glob("*.txt"))

    def hops(self) -> list[tuple[str, float, list[str]]]:
        """Every hop noted, by every worker: (hop, unix time, job ids)."""
        noted = []
        for path in self.path.glob("*.hops"):
            for line in path.read_text().splitlines():
                name, at, *job_ids = line.split()
                noted.append((name, float(at), job_ids))
        return noted


_process_marks: Marks | None = None


def process_marks() -> Marks:
    """This worker process's marks, opened on first use: a handler module is also
    imported where no ``BENCH_MARKS_DIR`` is set (a benchmark's own --help, a test
    importing it), and only a handler that runs needs it."""
    global _process_marks
    if _process_marks is None:
        _process_marks = Marks.from_env()
    return _process_marks


@contextlib.contextmanager
def marks_dir() -> Iterator[Marks]:
    path = Path(tempfile.mkdtemp(prefix="bench-marks-"))
    try:
        yield Marks(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
