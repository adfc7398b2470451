"""``python -m consumers``: the ``consumer`` command (the supervisor of
``--processes`` starts its workers this way)."""

from consumers.cli import main

main(prog_name="consumer")
