"""The ``after`` token of job lists: where the previous page stopped.

Opaque to clients (base64url), so its shape can change; inside, the sort key of
the last job seen: its id for lists in creation order, its finished_at and id for
lists of finished jobs (newest finished first). A token from a list of the other
order is refused rather than misread.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from hybrid_jobs.jobctl.service.errors import Invalid


class Order(StrEnum):
    CREATED = "c"  # job_id descending
    FINISHED = "f"  # finished_at, then job_id, descending


@dataclass(frozen=True)
class Cursor:
    order: Order
    job_id: uuid.UUID
    finished_at: datetime | None = None

    def encode(self) -> str:
        text = f"{self.order}:{self.job_id}"
        if self.order is Order.FINISHED:
            assert self.finished_at is not None
            text += f"@{self.finished_at.isoformat()}"
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str, order: Order) -> Cursor:
        bad = Invalid("after: not a page token (use the `next` of the previous page)", "after")
        try:
            text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            kind, _, rest = text.partition(":")
            ident, _, finished = rest.partition("@")
            found = cls(
                Order(kind),
                uuid.UUID(ident),
                datetime.fromisoformat(finished) if finished else None,
            )
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise bad from None
        if (found.order is Order.FINISHED) != (found.finished_at is not None):
            raise bad
        if found.finished_at is not None and found.finished_at.tzinfo is None:
            raise bad
        if found.order is not order:
            raise Invalid("after: this token belongs to a list in another order", "after")
        return found
