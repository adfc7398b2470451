"""This project's drain and latency next to its peers', measured one after another on
this machine, against the same PostgreSQL server and the same RabbitMQ broker.

Every contender gets the same two measurements with the same K worker processes:
drain (N no-op jobs enqueued at once; jobs/s until all have run) and latency (one job
per enqueue at a fixed rate; from the enqueue's return to the handler's first line,
p50/p95/p99; below zero where a worker that hears the commit's notification itself
starts the handler before the producer's enqueue returns, as PgQueuer's can on a
busy machine, and no ratio is given then). The contenders:

  hybrid-jobs  this project: `python -m bench.drain --no-baseline` (1 relay, K consumers)
  pgqueuer     PgQueuer at batch size 10 and 100, K workers, asyncpg
  celery       Celery on RabbitMQ, K solo-pool workers, acks_late, prefetch 16
  skiplocked   a plain table and K processes claiming 1 or 10 rows per statement
  floor        this design's hops (NOTIFY, relay, RabbitMQ, fenced claim and end) with
               the least SQL each needs and no feature: what the shape costs

Each runs in a scratch database or broker queue of its own, removed afterwards (also
on failure or Ctrl-C). How each is set up, and why that is fair, is in the docstring
of its module under bench/peers/. The ratios divide this project's figure by the
peer's: above 1 for jobs/s and below 1 for latency favour this project. Other work on
the machine shows up in the figures; the load averages in the header say how busy it
was. PgQueuer and Celery come from the bench extra (pip install -e '.[bench]'); a
missing one is skipped with a note.

With --repeat N the contenders run N rounds, one after another within each round, so
a busy minute of the machine falls on all of them alike; each figure is the median of
a contender's rounds, and the JSON keeps every round. The header says whether
autovacuum was on (this machine's CI setting is off; production runs it on).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import signal
import statistics
import sys
from dataclasses import asdict, dataclass, field
from types import FrameType

from bench.common import machine, pace_options, server_versions
from bench.peers.base import Contender, Figures, Settings, say

GROUPS = {
    "hybrid-jobs": "bench.peers.hybrid",
    "pgqueuer": "bench.peers.pgqueuer_peer",
    "celery": "bench.peers.celery_peer",
    "skiplocked": "bench.peers.skiplocked",
    "floor": "bench.peers.floor",
}
OURS = "hybrid-jobs"
EXTRA = "pip install -e '.[bench]'"
PEER_PACKAGES = ("pgqueuer", "celery")
LATENCY_KEYS = ("p50_ms", "p95_ms", "p99_ms")
OWN_PACKAGES = {"bench", "harness", "hybrid_jobs"}


@dataclass
class Row:
    name: str
    group: str
    setup: str
    figures: Figures | None = None
    error: str | None = None
    rounds: list[Figures] = field(default_factory=list)


def load(groups: list[str]) -> tuple[list[Contender], list[dict[str, str]]]:
    contenders: list[Contender] = []
    skipped: list[dict[str, str]] = []
    for group in groups:
        try:
            module = importlib.import_module(GROUPS[group])
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] in OWN_PACKAGES:
                raise  # a bug of ours, not a peer that is not installed
            reason = f"{exc.name} is not installed ({EXTRA})"
            say(f"{group}: skipped, {reason}")
            skipped.append({"group": group, "reason": reason})
            continue
        contenders.extend(module.contenders())
    return contenders, skipped


class Interrupted:
    """Whether Ctrl-C came: a contender that fails while being interrupted (say, inside
    an event loop that turned the signal into a cancellation) is not a failure to
    report but the end of the run."""

    seen = False

    @classmethod
    def handler(cls, signum: int, frame: FrameType | None) -> None:
        cls.seen = True
        raise KeyboardInterrupt


def run(contenders: list[Contender], settings: Settings, repeat: int = 1) -> list[Row]:
    """Every contender ``repeat`` times, round after round (each round runs them all,
    in order); a row's figures are the medians of its rounds. A contender that fails
    once is out of the later rounds."""
    rows = [Row(c.name, c.group, c.setup) for c in contenders]
    for round_ in range(1, repeat + 1):
        for i, (contender, row) in enumerate(zip(contenders, rows, strict=True), 1):
            if row.error:
                continue
            where = f"round {round_}/{repeat}, " if repeat > 1 else ""
            say(f"[{where}{i}/{len(contenders)}] {contender.name}: {contender.setup}")
            try:
                figures = contender.measure(settings)
            except Exception as exc:
                if Interrupted.seen:
                    raise KeyboardInterrupt from exc
                row.error = f"{type(exc).__name__}: {exc}"
                say(f"{contender.name}: failed: {row.error}")
                continue
            row.rounds.append(figures)
            lat = figures.latency
            say(
                f"{contender.name}: {figures.drain_jobs_per_s:,.0f} jobs/s; latency "
                + ", ".join(f"{k.removesuffix('_ms')} {_ms(lat.get(k))} ms" for k in LATENCY_KEYS)
            )
    for row in rows:
        if row.rounds and not row.error:
            row.figures = median_of(row.rounds)
    return rows


def median_of(rounds: list[Figures]) -> Figures:
    """One contender's rounds as one: the median of each figure (of one round, that
    round), and the details of the round whose drain was the median."""
    if len(rounds) == 1:
        return rounds[0]
    drains = [f.drain_jobs_per_s for f in rounds]
    latency = {
        key: statistics.median(f.latency[key] for f in rounds)
        for key in rounds[0].latency
        if all(key in f.latency for f in rounds)
    }
    middle = sorted(rounds, key=lambda f: f.drain_jobs_per_s)[len(rounds) // 2]
    return Figures(statistics.median(drains), latency, middle.details)


def ratios(ours: Figures | None, peer: Figures | None) -> dict[str, float] | None:
    if ours is None or peer is None or ours is peer:
        return None
    found = {"jobs_per_s": ours.drain_jobs_per_s / peer.drain_jobs_per_s}
    for key in LATENCY_KEYS:
        if peer.latency.get(key, 0) > 0:
            found[key] = ours.latency[key] / peer.latency[key]
    return {k: round(v, 2) for k, v in found.items()}


def report(
    rows: list[Row], skipped: list[dict[str, str]], settings: Settings, info: dict[str, object]
) -> dict[str, object]:
    ours = next((r.figures for r in rows if r.group == OURS and r.figures), None)
    return {
        "benchmark": "compare",
        "settings": asdict(settings),
        "machine": info,
        "results": [
            {
                "name": r.name,
                "group": r.group,
                "setup": r.setup,
                "drain_jobs_per_s": round(r.figures.drain_jobs_per_s) if r.figures else None,
                "latency": r.figures.latency if r.figures else None,
                "details": r.figures.details if r.figures else None,
                "ours_to_peer": ratios(ours, r.figures),
                "rounds": [
                    {"drain_jobs_per_s": round(f.drain_jobs_per_s), "latency": f.latency}
                    for f in r.rounds
                ],
                "error": r.error,
            }
            for r in rows
        ],
        "skipped": skipped,
    }


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(data: dict[str, object]) -> str:
    settings = data["settings"]
    info = data["machine"]
    results = data["results"]
    assert isinstance(settings, dict) and isinstance(info, dict) and isinstance(results, list)
    load_before, load_after = info["load_before"], info["load_after"]
    lines = [
        f"drain: {settings['jobs']:,} no-op jobs enqueued at once, "
        f"{settings['workers']} worker processes each",
        f"latency: {settings['rate']:g} jobs/s for {settings['seconds']:g} s, one job per "
        "enqueue, enqueue return to handler start",
        f"machine: {info['cpus']} cpus, Python {info['python']}, PostgreSQL "
        f"{info['postgresql']}, RabbitMQ {info['rabbitmq']}",
        f"load average (1/5/15 min): {load_before} before, {load_after} after; "
        "contenders ran one after another",
        f"autovacuum: {info.get('autovacuum', '?')}; "
        + (
            f"{settings['repeat']} rounds, each figure the median of a contender's rounds"
            if settings.get("repeat", 1) > 1
            else "one round"
        ),
        "",
    ]
    header = ["", "jobs/s", "p50 ms", "p95 ms", "p99 ms", "ours/peer:", "jobs/s", "p50", "p95"]
    header.append("p99")
    body: list[list[str]] = []
    for r in results:
        lat = r["latency"] or {}
        ratio = r["ours_to_peer"] or {}
        jobs = r["drain_jobs_per_s"]
        body.append(
            [
                r["name"],
                "failed" if r["error"] else f"{jobs:,}",
                *(_ms(lat.get(k)) for k in LATENCY_KEYS),
                "",
                _ratio(ratio.get("jobs_per_s")),
                *(_ratio(ratio.get(k)) for k in LATENCY_KEYS),
            ]
        )
    if not body:
        lines.append("no contender ran")
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    for row in [header, *body] if body else []:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    lines += [
        "",
        "ours/peer: this project's figure divided by the peer's; jobs/s above 1 and latency "
        "below 1 favour this project.",
        "",
    ]
    name_width = max((len(r["name"]) for r in results), default=0)
    for r in results:
        lines.append(f"{r['name'].ljust(name_width)}  {r['setup']}")
        if r["error"]:
            lines.append(f"{''.ljust(name_width)}  failed: {r['error'].splitlines()[0]}")
    for s in data["skipped"]:  # type: ignore[attr-defined]
        lines.append(f"{s['group']}: skipped, {s['reason']}")
    return "\n".join(lines)


def machine_info() -> dict[str, object]:
    info: dict[str, object] = {**machine(), **server_versions()}
    for package in PEER_PACKAGES:
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    return info


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _terminated(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds every `finally`: workers stopped, databases and queues dropped.
    raise SystemExit(128 + signum)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=_Formatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained at once")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes for every contender (our consumer processes)",
    )
    pace_options(parser, seconds=10, what="the latency run")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(GROUPS),
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=f"run only these contenders, of: {', '.join(GROUPS)} (default: all)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every contender, alternated; each figure the median of its rounds",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the figures as JSON on stdout (the table then goes to stderr)",
    )
    args = parser.parse_args()
    settings = Settings(args.jobs, args.workers, args.rate, args.seconds)
    # Our own handlers, whatever was inherited (a shell's background job ignores
    # SIGINT): workers run in sessions of their own, so the signal reaches only this
    # process, whose cleanup stops them, then drops the databases and queues.
    signal.signal(signal.SIGINT, Interrupted.handler)
    signal.signal(signal.SIGTERM, _terminated)

    groups = [g for g in GROUPS if g in getattr(args, "only", GROUPS)]
    contenders, skipped = load(groups)
    info = machine_info() | {"load_before": _load()}
    try:
        rows = run(contenders, settings, max(args.repeat, 1))
    except KeyboardInterrupt:
        say("interrupted: workers stopped, scratch databases and queues removed")
        sys.exit(130)
    info["load_after"] = _load()
    data = report(rows, skipped, settings, info)
    data["settings"] = {**asdict(settings), "repeat": max(args.repeat, 1)}
    if args.json:
        print(table(data), file=sys.stderr)
        print(json.dumps(data, indent=2))
    else:
        print(table(data))
    if any(r.error for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
