"""What a handler raises to say how its attempt ended, and what it may see raised."""

from __future__ import annotations

from datetime import timedelta

from hybrid_jobs.consumers.outcome import MAX_RETRY_DELAY


class Retry(Exception):
    """Try again later: after ``delay`` (seconds or a timedelta), else the handler's
    backoff. The attempt counts; once the job's attempts are spent it ends FAILED."""

    code = "RETRY"

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and not 0 <= delay <= MAX_RETRY_DELAY:
            raise ValueError("Retry delay must be between 0 seconds and a year")
        self.delay = delay


class Snooze(Exception):
    """Not yet: look at the job again in ``seconds`` (a number or a timedelta, from 0
    up to a year). The attempt is refunded, so a job may snooze any number of times
    without spending its budget; each snooze is recorded in the job's history
    (``SNOOZED``), where a handler that never stops snoozing shows. Its lease ends as
    any other outcome ends it: a key, a resource and a tenant slot it held go to the
    next job. A job asked to cancel ends CANCELLED instead."""

    code = "SNOOZED"

    def __init__(self, seconds: float | timedelta) -> None:
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"Snooze takes seconds or a timedelta, not {type(seconds).__name__}")
        if not 0 <= seconds <= MAX_RETRY_DELAY:
            raise ValueError("Snooze seconds must be between 0 and a year")
        super().__init__(f"snoozed for {seconds:.10g} s")
        self.seconds = float(seconds)


class Permanent(Exception):
    """Fail the job now, whatever attempts are left: retrying cannot help (bad input,
    a declined card). ``code`` becomes the job's ``last_error_code``."""

    def __init__(self, message: str = "", *, code: str = "PERMANENT") -> None:
        super().__init__(message or code)
        self.code = code


class Cancel(Exception):
    """Stop and end the job CANCELLED: raise it after seeing ``job.cancel_requested``
    (and recording whatever partial effects matter)."""

    code = "CANCELLED"


class LeaseLost(Exception):
    """This worker no longer holds the job: its lease expired and the job was taken
    over, or it finished another way. Raised by ``job.transaction()`` when the fenced
    completion matches nothing; the transaction, and the handler's writes in it, were
    rolled back. Raised by ``job.step`` when the step's fenced record matches nothing:
    the step is not recorded. A handler need not catch it."""
