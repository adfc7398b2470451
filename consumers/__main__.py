"""``python -m hybrid_jobs.consumers``: the ``consumer`` command (the supervisor of
``--processes`` starts its workers this way)."""

from hybrid_jobs.consumers.cli import main

main(prog_name="consumer")
