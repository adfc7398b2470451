"""The dashboard's sessions (``dashboard_sessions``): opened at sign-in, checked on
every page and button, ended at sign-out. Run by ``jobctl serve``."""

from __future__ import annotations

from typing import Final

DASHBOARD_SESSION_CREATE: Final = """
INSERT INTO dashboard_sessions (session_hash, token_digest, expires_at)
VALUES (%(hash)s, %(digest)s, now() + make_interval(secs => %(session_seconds)s))
RETURNING expires_at
"""

# A live session opened with the current token: one primary-key lookup.
DASHBOARD_SESSION_VALID: Final = """
SELECT expires_at FROM dashboard_sessions
WHERE session_hash = %(hash)s AND token_digest = %(digest)s AND expires_at > now()
"""

DASHBOARD_SESSION_END: Final = """
DELETE FROM dashboard_sessions WHERE session_hash = %(hash)s RETURNING true
"""

# The sessions that ended on their own: expired, or opened with another token than
# the current one (its digest), deleted so that putting that token back does not
# revive them. Run at each sign-in and when jobctl serve sees a new token, a
# bounded batch (the caller repeats a full one). A scan: the table holds about as
# many rows as people signed in over the last 12 hours.
DASHBOARD_SESSION_EXPIRE: Final = """
WITH gone AS (
    DELETE FROM dashboard_sessions
    WHERE session_hash IN (SELECT session_hash FROM dashboard_sessions
                           WHERE expires_at < now() OR token_digest <> %(digest)s
                           LIMIT 1000)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
