"""The HTTP API of ``jobctl serve``: ``create_app(ApiSettings(...))``, a thin layer
over jobctl.service. The routes and their documents are in /openapi.json."""

from jobctl.api.app import create_app
from jobctl.api.settings import ApiSettings, api_token

__all__ = ["ApiSettings", "api_token", "create_app"]
