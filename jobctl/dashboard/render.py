"""Templates, the filters they format figures with, and the headers every page
carries."""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from hybrid_jobs.jobctl.api.headers import HTML_POLICY
from hybrid_jobs.jobctl.dashboard.auth import Viewer, root
from hybrid_jobs.jobctl.dashboard.flash import COOKIE as FLASH_COOKIE
from hybrid_jobs.jobctl.dashboard.flash import Flash, take_flash
from hybrid_jobs.jobctl.output import budget, error_is_current, held_for

# Everything the pages need comes from this server (no inline script or style
# either), pages cannot be framed (clickjacking), forms post only here. (Every
# answer gets these from jobctl.api.headers; a page says them itself too.)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": HTML_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# Payloads, results and progress are shown up to this many characters.
SHOWN_JSON: Final = 20_000
DEFAULT_REFRESH_SECONDS: Final = 5
# What a table shows for "no value".
NONE: Final = "\N{EN DASH}"

env = Environment(
    loader=PackageLoader("hybrid_jobs.jobctl.dashboard", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def duration(seconds: float | None) -> str:
    """A span for people: 850 µs, 12 ms, 3.4 s, 5 min 10 s, 2 h 5 min, 3 d 4 h."""
    if seconds is None or math.isnan(seconds):
        return NONE
    s = abs(seconds)
    if s < 0.001:
        text = f"{s * 1e6:.0f} µs"
    elif s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 60 and s == int(s):
        text = f"{int(s)} s"  # a setting (every 5 s), not a measurement
    elif s < 10:
        text = f"{s:.2f} s"
    elif s < 60:
        text = f"{s:.1f} s"
    elif s < 3600:
        text = _two(int(s // 60), "min", int(s % 60), "s")
    elif s < 86400:
        text = _two(int(s // 3600), "h", int(s % 3600 // 60), "min")
    else:
        text = _two(int(s // 86400), "d", int(s % 86400 // 3600), "h")
    return "-" + text if seconds < 0 else text


def _two(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big} {big_unit}" + (f" {small} {small_unit}" if small else "")


def progress(value: Any) -> dict[str, Any] | None:
    """A handler's job.progress(done, total=..., stage=...) as figures for a bar;
    None for anything else (shown as JSON)."""
    if not isinstance(value, dict):
        return None
    done, total = value.get("done"), value.get("total")
    if not (isinstance(done, int | float) and isinstance(total, int | float)):
        return None
    if isinstance(done, bool) or isinstance(total, bool) or total <= 0:
        return None
    share = min(1.0, max(0.0, done / total))
    return {"done": done, "total": total, "share": share, "stage": value.get("stage")}


def relative(at: datetime | None, now: datetime) -> str:
    """'12 s ago' or 'in 5 min 3 s'."""
    if at is None:
        return NONE
    seconds = (now - at).total_seconds()
    if abs(seconds) < 0.5:
        return "now"
    return f"{duration(seconds)} ago" if seconds > 0 else f"in {duration(-seconds)}"


def timestamp(at: datetime | None) -> str:
    if at is None:
        return NONE
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def span(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return NONE
    return f"{value:,.{digits}f}"


def short_id(job_id: uuid.UUID | str) -> str:
    # UUIDv7 ids start with their creation time, so jobs made together share a
    # prefix; the random tail tells them apart.
    return "…" + str(job_id)[-12:]


def segment(value: str) -> str:
    """A name as one path segment of a URL (a schedule's name may hold a slash)."""
    return quote(value, safe="")


# The explicit directional formatting characters (embeddings, overrides, isolates
# and their ends): they reorder the text after them, and an isolate's end (U+2069)
# ends the isolate Chromium makes of a <bdi> too, so isolating a value does not
# keep them in; shown as escapes, \u202e, as the CLI does. (The marks and the
# joiners only take part in their own run's order: free text keeps them, right to
# left text and emoji need them.)
_EXPLICIT: Final = re.compile("[\u202a-\u202e\u2066-\u2069]")
# In a name, what cannot be seen at all is shown as well (the marks, the zero-width
# characters): two names that look the same are different names.
_INVISIBLE: Final = re.compile("[\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]")


def _code(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def visible(value: object) -> str:
    """Plain text (a page's title, a flash message, a sentence that quotes names)
    with every invisible character written as its escape: no element can isolate a
    part of a title, or a name inside a sentence."""
    return _INVISIBLE.sub(_code, str(value))


def _isolated(value: object, shown: re.Pattern[str]) -> Markup:
    """``value`` escaped, in a <bdi> (so that right-to-left text in it does not move
    the page's text beside it), the characters ``shown`` matches as escapes in a
    span of their own."""
    text = "" if value is None else str(value)
    pieces: list[Markup] = []
    at = 0
    for found in shown.finditer(text):
        pieces.append(escape(text[at : found.start()]))
        pieces.append(Markup('<span class="invisible">{}</span>').format(_code(found)))
        at = found.end()
    pieces.append(escape(text[at:]))
    return Markup("<bdi>{}</bdi>").format(Markup().join(pieces))


def user(value: object) -> Markup:
    """Free text someone else wrote (an error message, a progress stage), isolated:
    it cannot reorder the page's own text around it."""
    return _isolated(value, _EXPLICIT)


def name(value: object) -> Markup:
    """A name (job type, queue, key, resource, schedule, worker, error code),
    isolated, with every invisible character shown."""
    return _isolated(value, _INVISIBLE)


def names(values: Any) -> Markup:
    """Several names, each isolated on its own (:func:`name`), comma-separated."""
    return Markup(", ").join(name(v) for v in values)


def pretty(value: Any, raw: bool = False) -> str:
    """A JSON value, indented; ``raw``: a value served as its JSON text already (one
    nested past what can be decoded, JobView.as_text), shown as it is. Directional
    controls are written as JSON's own escapes (the same value): raw, one would
    reorder the rest of its line."""
    if raw and isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    text = _EXPLICIT.sub(_code, text)
    if len(text) > SHOWN_JSON:
        return text[:SHOWN_JSON] + f"\n… ({len(text) - SHOWN_JSON:,} more characters)"
    return text


env.filters.update(
    duration=duration,
    timestamp=timestamp,
    number=number,
    short_id=short_id,
    pretty=pretty,
    segment=segment,
    visible=visible,
    user=user,
    name=name,
    names=names,
    budget=budget,
)
env.globals.update(
    relative=relative,
    span=span,
    progress=progress,
    held_for=held_for,
    error_is_current=error_is_current,
)


def page(
    request: Request,
    template: str,
    viewer: Viewer | None,
    *,
    status: int = 200,
    **context: Any,
) -> Response:
    """A whole page. Its flash message (set by the action that led here) is shown
    once; the auto-refresh replaces only the page's #content, so it stays put."""
    flash: Flash | None = take_flash(request, None if viewer is None else viewer.flash_key)
    mount = root(request)
    html = env.get_template(template).render(
        request=request,
        viewer=viewer,
        flash=flash,
        root=mount,
        path=request.url.path.removeprefix(mount) or "/",
        here=_here(request),
        refresh_default=DEFAULT_REFRESH_SECONDS,
        **context,
    )
    response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
    if FLASH_COOKIE in request.cookies:
        # Shown once; one that was not shown (unsigned, unreadable) goes too.
        Flash.clear(response, mount)
    return response


def _here(request: Request) -> str:
    """This page's path and query, where a form on it sends the person back to."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")
