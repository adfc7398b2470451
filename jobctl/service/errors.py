"""What the service layer refuses, as exceptions each surface turns into its own
form: a 4xx problem document in the API, one line and an exit status in the CLI.

Every message is safe to show (no URL, no token) and names what to fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_jobs.schema.states import JobState

if TYPE_CHECKING:
    from hybrid_jobs.jobctl.service.models import TypePolicy


class ServiceError(Exception):
    """Base of the refusals below."""


class Invalid(ServiceError):
    """An argument is unacceptable. ``field`` names it (a request field, a query
    parameter, an option), when one is to blame."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFound(ServiceError):
    """No such job, schedule, ... (or, for a job, retention deleted it)."""


class WrongState(ServiceError):
    """The job is in a state the action does not apply to (retrying a job that is
    running, cancelling one that succeeded)."""

    def __init__(self, message: str, state: JobState) -> None:
        super().__init__(message)
        self.state = state


class NotAllowed(ServiceError):
    """The job's type does not allow the action (its handler's replay=False, or
    cancel_running=False for a running job); ``policy`` is what it allows."""

    def __init__(self, message: str, state: JobState, policy: TypePolicy) -> None:
        super().__init__(message)
        self.state = state
        self.policy = policy


class IdempotencyMismatch(ServiceError):
    """An Idempotency-Key was used before for a different request."""


def invalid_argument(exc: ValueError | TypeError, field: str | None = None) -> Invalid:
    """The producer API's ValueError/TypeError (its message names the argument) as an
    Invalid."""
    return Invalid(str(exc), field)
