"""The HTTP API of ``jobctl serve``: ``create_app(ApiSettings(...))``, a thin layer
over jobctl.service. The routes and their documents are in /openapi.json."""

from hybrid_jobs.jobctl.api.app import create_app
from hybrid_jobs.jobctl.api.settings import ApiSettings, PublicUrl
from hybrid_jobs.jobctl.api.tokens import Tokens, token_from_environment

__all__ = ["ApiSettings", "PublicUrl", "Tokens", "create_app", "token_from_environment"]
