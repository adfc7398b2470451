"""What ``jobctl doctor`` finds, and the exit status it makes of it.

Every check ends in findings of one of four levels:

- ``ok``: checked, and as it should be;
- ``note``: worth knowing, nothing to do (a setting someone chose, a measurement
  that cannot be made);
- ``warning``: works now, but costs speed or safety margin, or will fail under
  load; ``--strict`` makes warnings fail the run too;
- ``problem``: jobs wait, or a promise is at risk, until someone acts.

The exit status is 1 when a problem was found (or, with ``--strict``, a warning),
and 0 otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Level(StrEnum):
    OK = "ok"
    NOTE = "note"
    WARNING = "warning"
    PROBLEM = "problem"

    @property
    def rank(self) -> int:
        return list(Level).index(self)


@dataclass(frozen=True)
class Finding:
    """One thing a check found: ``check`` names the area (schema, postgres, clock,
    rabbitmq, relays, consumers, queues), ``title`` says it in a line, ``detail``
    gives the numbers, ``fix`` what to do (None when there is nothing to do)."""

    check: str
    level: Level
    title: str
    detail: str = ""
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"level": str(self.level)}


def failing(findings: Iterable[Finding], *, strict: bool = False) -> list[Finding]:
    """The findings that fail the run: problems, and with ``strict`` warnings too."""
    worst = Level.WARNING if strict else Level.PROBLEM
    return [f for f in findings if f.level.rank >= worst.rank]


def exit_code(findings: Iterable[Finding], *, strict: bool = False) -> int:
    return 1 if failing(findings, strict=strict) else 0


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """How many findings of each level, every level named (0 for none)."""
    found = Counter(f.level for f in findings)
    return {str(level): found[level] for level in Level}


def verdict(findings: list[Finding], *, strict: bool = False) -> str:
    """The last line for people: what was found, and whether that fails."""
    n = counts(findings)
    parts = [
        f"{n[level]} {level}{'' if n[level] == 1 or level is Level.OK else 's'}"
        for level in (Level.PROBLEM, Level.WARNING, Level.NOTE, Level.OK)
    ]
    code = exit_code(findings, strict=strict)
    why = " (--strict: warnings fail)" if strict and code and not n["problem"] else ""
    return f"{', '.join(parts)}: exit {code}{why}"
