"""Re-exported from harness.plans, where the benchmarks import it too."""

from harness.plans import plan

__all__ = ["plan"]
