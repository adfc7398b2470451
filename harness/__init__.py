"""What the tests and the benchmarks both stand on, needing none of the test extra:
whether the services answer, a scratch database migrated to head, a scratch broker
namespace and its clean-up, EXPLAIN of a statement as the code runs it, a long
history of finished jobs and the job lists planned over it, a backlog of waiting
jobs with their wake-ups, the claim's parameters, and the no-op and sleep handlers
both their consumers run.

Not part of the installed package (like ``bench/`` and ``tests/``): it is imported
from a checkout, where ``python -m bench.x`` and pytest run. The tests re-use it
through ``tests.support``; nothing in the product imports it (a contract of
import-linter, in pyproject.toml)."""
