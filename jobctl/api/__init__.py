"""The HTTP API of ``jobctl serve``: ``create_app(ApiSettings(...))``, a thin layer
over jobctl.service. The routes and their documents are in /openapi.json."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_jobs.jobctl.lazy import lazy_exports

if TYPE_CHECKING:
    from hybrid_jobs.jobctl.api.app import create_app
    from hybrid_jobs.jobctl.api.settings import ApiSettings, PublicUrl
    from hybrid_jobs.jobctl.api.tokens import Tokens, token_from_environment

# The module of each name, imported on first use (PEP 562): `jobctl serve` checks
# its settings and its token before it loads the web framework, so a refusal at
# start costs no import of FastAPI, the routes or the dashboard.
_MODULES: dict[str, str] = {
    "create_app": "app",
    "ApiSettings": "settings",
    "PublicUrl": "settings",
    "Tokens": "tokens",
    "token_from_environment": "tokens",
}

__all__ = ["ApiSettings", "PublicUrl", "Tokens", "create_app", "token_from_environment"]

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, __all__)
