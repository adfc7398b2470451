"""Re-exported from harness.plans, where the benchmarks import them too."""

from harness.plans import plan, reads

__all__ = ["plan", "reads"]
