"""Errors as ``application/problem+json`` (RFC 9457): ``status``, a ``title``, a
``detail`` that names the field at fault, and for invalid input every field's
message in ``errors``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import psycopg.errors
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.responses import Response

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.api.headers import security_headers
from hybrid_jobs.jobctl.api.waiters import TooManyWaiters
from hybrid_jobs.jobctl.service import (
    IdempotencyMismatch,
    Invalid,
    NotAllowed,
    NotFound,
    WrongState,
)
from hybrid_jobs.jobctl.service.models import jsonable

log = logging.getLogger("jobctl")

MEDIA_TYPE: Final = "application/problem+json"
# Seconds a client should wait before trying again when the database is away.
UNAVAILABLE_RETRY_AFTER: Final = 5

_TITLES: Final = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class FieldError(BaseModel):
    field: str
    """Where: body.queue, query.limit, header.Idempotency-Key, path.job_id."""
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    """What went wrong, naming the field or the setting at fault."""
    errors: list[FieldError] | None = Field(default=None)
    """For 422: each invalid field and why."""


def problem(
    status: int,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    errors: Sequence[FieldError] | None = None,
    **extensions: Any,
) -> Response:
    body = Problem(
        title=_TITLES.get(status, "Error"),
        status=status,
        detail=detail,
        errors=list(errors) if errors is not None else None,
        **extensions,
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=status,
        media_type=MEDIA_TYPE,
        headers=dict(headers or {}),
    )


def _where(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def _short(loc: Sequence[int | str]) -> str:
    # body.queue -> queue; query.limit -> limit: the name a client wrote.
    return _where(loc[1:] if len(loc) > 1 else loc)


async def _invalid_request(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    if any(e.get("type") == "json_invalid" for e in exc.errors()):
        return problem(400, "the body is not valid JSON")
    found = [
        FieldError(field=_where(e.get("loc", ())), message=str(e.get("msg", "invalid")))
        for e in exc.errors()
    ]
    first = exc.errors()[0] if exc.errors() else {}
    name = _short(first.get("loc", ())) or "request"
    detail = f"{name}: {first.get('msg', 'invalid')}"
    if len(found) > 1:
        detail += f" (and {len(found) - 1} more)"
    return problem(422, detail, errors=found)


async def _http(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return problem(exc.status_code, str(exc.detail), headers=exc.headers)


async def _invalid(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Invalid)
    field = exc.field or str(exc).split(" ", 1)[0].rstrip(":")
    return problem(422, str(exc), errors=[FieldError(field=field, message=str(exc))])


async def _not_found(_request: Request, exc: Exception) -> Response:
    return problem(404, str(exc))


async def _wrong_state(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WrongState)
    return problem(409, str(exc), state=str(exc.state))


async def _not_allowed(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NotAllowed)
    return problem(409, str(exc), state=str(exc.state), policy=jsonable(exc.policy))


async def _mismatch(_request: Request, exc: Exception) -> Response:
    return problem(
        422, str(exc), errors=[FieldError(field="header.Idempotency-Key", message=str(exc))]
    )


async def _backpressure(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, outbox.Backpressure)
    wait = max(1, math.ceil(exc.retry_after))
    return problem(
        429, str(exc), headers={"Retry-After": str(wait)}, tenant=exc.tenant, limit=exc.limit
    )


async def _too_many_waiters(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TooManyWaiters)
    # Connection: close gives the refused request's descriptor back at once.
    headers = {"Retry-After": str(exc.retry_after), "Connection": "close"}
    return problem(exc.status, str(exc), headers=headers, limit=exc.limit)


async def _database(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, sqlalchemy.exc.SQLAlchemyError)
    cause = getattr(exc, "orig", None) or exc
    busy = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)
    if isinstance(cause, busy):
        detail = "the database did not answer in time; try again"
    elif isinstance(exc, sqlalchemy.exc.TimeoutError | sqlalchemy.exc.OperationalError) or (
        isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated
    ):
        detail = "the database is not reachable; try again"
    else:
        log.error("api.database_error", exc_info=exc, extra={"path": request.url.path})
        return problem(500, "the database refused a statement; see the server's log")
    log.warning(
        "api.database_unavailable",
        extra={"path": request.url.path, "error": type(cause).__name__},
    )
    return problem(503, detail, headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)})


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered with a problem document (never
    Starlette's text/plain 500), naming nothing of the cause."""
    log.error(
        "api.unexpected_error",
        exc_info=exc,
        extra={"method": request.method, "path": request.url.path},
    )
    detail = "the server failed unexpectedly; its log has the traceback (api.unexpected_error)"
    response = problem(500, detail)
    # This answer leaves by the outermost middleware, past the one that adds these.
    public = getattr(request.app.state, "public_url", None)
    scheme = "https" if public is not None and public.scheme == "https" else request.url.scheme
    for name, value in security_headers(scheme, request.url.path, MEDIA_TYPE).items():
        response.headers.setdefault(name, value)
    return response


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Invalid, _invalid)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(WrongState, _wrong_state)
    app.add_exception_handler(NotAllowed, _not_allowed)
    app.add_exception_handler(IdempotencyMismatch, _mismatch)
    app.add_exception_handler(outbox.Backpressure, _backpressure)
    app.add_exception_handler(TooManyWaiters, _too_many_waiters)
    app.add_exception_handler(sqlalchemy.exc.SQLAlchemyError, _database)
    app.add_exception_handler(Exception, _unexpected)


# What a change that takes a JSON body may be refused with.
WITH_BODY = (400, 401, 403, 413, 415, 422, 503)


def responses(*statuses: int, **documented: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """The problem responses a route documents (the OpenAPI document then lists
    them under application/problem+json; see jobctl.api.app)."""
    described = {
        400: "The body is not well-formed JSON, or the Host is not one this server serves.",
        401: "No bearer token, or the wrong one.",
        403: "This server has no API token configured, so it refuses every change.",
        404: "No such job, schedule or queue.",
        409: "The job is in a state the action does not apply to, or its type does not"
        " allow the action (`policy` says what it allows).",
        413: "The body is larger than the server accepts.",
        415: "The body is not JSON (Content-Type: application/json).",
        422: "Invalid input; `detail` names the field.",
        429: "Too many requests: the tenant has its max_queued jobs waiting (an enqueue),"
        " this client sent too many wrong tokens, or it holds as many ?wait= requests as"
        " one client may; see Retry-After.",
        503: "The database is not reachable now, or (?wait=) the server holds as many"
        " waiting requests as it may; see Retry-After.",
    }
    # Whatever needs the token can be refused for too many wrong ones.
    wanted = sorted({*statuses, 429} if 401 in statuses else set(statuses))
    found: dict[int | str, dict[str, Any]] = {
        s: {"model": Problem, "description": described[s]} for s in wanted
    }
    # Success responses' extras (headers), by status: ok_202={...}.
    for key, value in documented.items():
        found[int(key.removeprefix("ok_"))] = value
    return found
