"""The live dashboard at ``/`` of ``jobctl serve``.

Server-rendered (Jinja2 templates in ``templates/``), with one small hand-written
script (``static/dashboard.js``) that refreshes each page's content every few
seconds and can be paused; everything it needs ships in this package, nothing is
loaded from elsewhere. Pages read through the service layer (``jobctl.service``)
and the metrics collector's cache; buttons act through the service layer too, so
the dashboard, the CLI and the HTTP API cannot disagree.

Who may look and act: :mod:`jobctl.dashboard.auth`.

``create_app`` calls :func:`install`.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response

from hybrid_jobs.jobctl.dashboard import actions, pages, render
from hybrid_jobs.jobctl.dashboard.auth import Refused, SignInRequired, root

STATIC_PATH = "/static"


def install(app: FastAPI) -> None:
    """Mount the dashboard's pages, buttons and static files on ``app``."""
    app.include_router(pages.router)
    app.include_router(actions.router)
    app.mount(
        STATIC_PATH,
        StaticFiles(packages=[("hybrid_jobs.jobctl.dashboard", "static")]),
        name="dashboard-static",
    )
    app.add_exception_handler(SignInRequired, _sign_in)
    app.add_exception_handler(Refused, _refused)


async def _sign_in(request: Request, _exc: Exception) -> Response:
    query = request.url.query
    here = request.url.path + (f"?{query}" if query else "")
    return RedirectResponse(f"{root(request)}/login?next={quote(here, safe='')}", status_code=303)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return render.page(request, "refused.html", None, status=exc.status, reason=exc.reason)
