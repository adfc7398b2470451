"""A handler's declared payload: the keyword-only parameters after ``job``.

``def send_receipt(job, *, order_id: int, note: str = "")`` says what its payload
holds. The same check runs twice: when the job is enqueued from the handler's object
(a ``TypeError`` naming the field, before anything is written) and before the
handler is called (a payload that does not fit fails the job at once, BAD_PAYLOAD:
no retry can fix it). The annotations a payload can satisfy are checked (``int``,
``float``, ``str``, ``bool``, ``list``, ``dict``, ``None``, their unions, ``Literal``,
and the items of ``list[...]`` and ``dict[str, ...]``); any other annotation, or
one only a type checker can resolve, is taken as is.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Union

# The job's last_error_code when its payload does not fit its handler's parameters.
BAD_PAYLOAD: Final = "BAD_PAYLOAD"
# The job's last_error_code when the stored input it runs on (enqueue's payload_ref)
# was redacted before it started: it fails at once, without calling its handler.
INPUT_REDACTED: Final = "INPUT_REDACTED"

# What bind() is given for the job: only the payload's fields are checked by it.
_JOB: Final = object()


@dataclass(frozen=True)
class Field:
    name: str
    required: bool
    annotation: Any  # resolved; Any when unannotated or unresolvable


@dataclass(frozen=True)
class PayloadSpec:
    """The fields a handler takes, and how to check a payload against them."""

    job_type: str
    fields: tuple[Field, ...]
    # ``**fields`` in the signature: other fields are accepted, checked against this.
    others: Any | None
    signature: inspect.Signature

    @classmethod
    def of(cls, job_type: str, fn: Callable[..., Any]) -> PayloadSpec | None:
        """The handler's declared payload; None when it takes only the job (its
        payload is whatever JSON the producer sent, unchecked)."""
        signature = inspect.signature(fn)
        declared = [
            p for p in signature.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)
        ]
        if not declared:
            return None
        hints = _hints(fn, declared)
        fields = tuple(
            Field(p.name, p.default is p.empty, hints[p.name])
            for p in declared
            if p.kind is p.KEYWORD_ONLY
        )
        var = next((p for p in declared if p.kind is p.VAR_KEYWORD), None)
        return cls(job_type, fields, None if var is None else hints[var.name], signature)

    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def check(self, payload: Any) -> dict[str, Any]:
        """The payload as the handler's keyword arguments; ``TypeError`` naming the
        first field that is missing, unexpected or of the wrong type."""
        where = f"{self.job_type}:"
        if not isinstance(payload, Mapping):
            raise TypeError(
                f"{where} the payload must be an object of the handler's fields"
                f" ({', '.join(self.names()) or 'any'}), not {_kind(payload)}"
            )
        known = {f.name: f for f in self.fields}
        # An unexpected field first: a misspelt one is why the real one is missing.
        for name in payload:
            if not isinstance(name, str):
                raise TypeError(f"{where} field names are text, not {_kind(name)} {name!r}")
            if name not in known and self.others is None:
                raise TypeError(f"{where} unexpected field {name!r}{_nearest(name, known)}")
        for f in self.fields:
            if f.required and f.name not in payload:
                raise TypeError(f"{where} missing field {f.name!r}")
        for name, value in payload.items():
            field = known.get(name)
            annotation = field.annotation if field is not None else self.others
            problem = _problem(value, annotation, f"field {name!r}")
            if problem is not None:
                raise TypeError(f"{where} {problem}")
        try:
            # The last word: what bind() refuses, the call would refuse too (a field
            # named as the job's own parameter, say).
            self.signature.bind(_JOB, **payload)
        except TypeError as exc:
            raise TypeError(f"{where} {exc}") from None
        return dict(payload)


def _hints(fn: Callable[..., Any], params: list[inspect.Parameter]) -> dict[str, Any]:
    """Each parameter's annotation, resolved; Any for one that cannot be (a name
    imported only under TYPE_CHECKING: there is nothing at run time to check)."""
    try:
        every = typing.get_type_hints(fn)
    except Exception:
        every = {}
        namespace = getattr(inspect.unwrap(fn), "__globals__", {})
        for p in params:
            if p.annotation is p.empty:
                continue
            holder = types.SimpleNamespace(__annotations__={p.name: p.annotation})
            try:
                every.update(typing.get_type_hints(holder, namespace))
            except Exception:  # noqa: S112 - unresolvable: left unchecked
                continue
    return {p.name: every.get(p.name, Any) for p in params}


def _nearest(name: str, known: Mapping[str, Field]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return (
        f" (did you mean {close[0]!r}?)" if close else f" (it takes {', '.join(known) or 'none'})"
    )


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _describe(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _problem(value: Any, annotation: Any, where: str) -> str | None:
    """Why ``value`` does not fit ``annotation`` (None: it fits, or the annotation
    is not one a JSON value is checked against)."""
    if annotation is Any or annotation is object:
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    wrong = f"{where} must be {_describe(annotation)}, not {_kind(value)}"
    if origin is Union or origin is types.UnionType:
        problems = [_problem(value, a, where) for a in args]
        if any(p is None for p in problems):
            return None
        # Optional[X]: what is wrong with it as an X (an item of a list, say).
        some = [p for a, p in zip(args, problems, strict=True) if a is not type(None)]
        return some[0] if len(some) == 1 else wrong
    if annotation is None or annotation is type(None):
        return None if value is None else wrong
    if origin is Literal:
        # 1 == True in Python; a Literal[1] takes the number, not the boolean.
        return None if any(type(value) is type(a) and value == a for a in args) else wrong
    if annotation is bool or annotation is str:
        return None if isinstance(value, annotation) else wrong
    if annotation is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else wrong
    if annotation is float:
        return None if isinstance(value, int | float) and not isinstance(value, bool) else wrong
    if annotation is list or origin is list:
        # A tuple is stored as a JSON array: the handler gets a list.
        if not isinstance(value, list | tuple):
            return wrong
        item = args[0] if args else Any
        return next(
            (p for i, v in enumerate(value) if (p := _problem(v, item, f"{where}[{i}]"))), None
        )
    if annotation is dict or origin is dict or typing.is_typeddict(annotation):
        if not isinstance(value, dict):
            return wrong
        item = args[1] if len(args) == 2 else Any
        return next(
            (p for k, v in value.items() if (p := _problem(v, item, f"{where}[{k!r}]"))), None
        )
    return None
