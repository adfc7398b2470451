"""EXPLAIN ANALYZE of a statement as the code runs it, for the tests and benchmarks
that check a statement reads what its indexes give it.

Custom: planned for these values, as a first execution is. Generic: prepared with
$n parameters under plan_cache_mode = force_generic_plan, the plan a pooled
connection may settle on after a few executions (psycopg prepares a statement on its
fifth). Either way inside a transaction that is rolled back, so a statement that
writes leaves nothing behind.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

_PARAM = re.compile(r"%\((\w+)\)s")


def plan(
    conn: psycopg.Connection, statement: str, params: dict[str, Any], *, generic: bool = False
) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON): the JSON document, a list of one plan."""
    with conn.transaction(force_rollback=True):
        if not generic:
            row = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params
            ).fetchone()
        else:
            order: list[str] = []

            def number(match: re.Match[str]) -> str:
                if match.group(1) not in order:
                    order.append(match.group(1))
                return f"${order.index(match.group(1)) + 1}"

            name = f"p_{uuid.uuid4().hex[:8]}"
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE {name} AS {_PARAM.sub(number, statement)}")
            args = f"({', '.join(['%s'] * len(order))})" if order else ""
            # Literals, not bound parameters: EXECUTE takes a NULL for any parameter
            # type only as a literal.
            row = (
                psycopg.ClientCursor(conn)
                .execute(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}{args}",
                    [params[k] for k in order],
                )
                .fetchone()
            )
            conn.execute(f"DEALLOCATE {name}")
    assert row is not None
    found: list[dict[str, Any]] = row[0]
    return found


def reads(node: dict[str, Any], relation: str) -> Iterator[tuple[str, int, int]]:
    """Each scan of ``relation`` (or of one of its indexes) in a plan from
    :func:`plan`: its node type, the rows it produced or filtered away, all its loops
    together, and its loops (0: it never ran)."""
    ours = node.get("Relation Name") == relation or node.get("Index Name", "").startswith(
        f"{relation}_"
    )
    if ours and "Scan" in node["Node Type"]:
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        yield node["Node Type"], int(read * node["Actual Loops"]), node["Actual Loops"]
    for child in node.get("Plans", []):
        yield from reads(child, relation)
