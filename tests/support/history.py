"""Re-exported from harness.history, where the benchmarks import it too."""

from harness.history import fill

__all__ = ["fill"]
