"""Handlers that declare what their job types allow, for a real `consumer --app
tests.apps.policies` process: it records them when it starts."""

from __future__ import annotations

from hybrid_jobs import consumers


@consumers.handler("capture_payment", replay=False, cancel_running=False, on_cancel="compensate")
def capture_payment(job: consumers.Job) -> None:
    return None


@consumers.handler("send_receipt", on_cancel="none: a sent receipt stays sent")
def send_receipt(job: consumers.Job) -> None:
    return None


@consumers.handler("resize_image")
def resize_image(job: consumers.Job) -> None:
    return None
