"""Re-exported from harness.history, where the benchmarks import it too."""

from harness.history import fill, job_lists, middle_of_the_failed

__all__ = ["fill", "job_lists", "middle_of_the_failed"]
