"""Re-exported from harness.scratch, where the benchmarks import it too."""

from harness.scratch import scratch_database, scratch_topology

__all__ = ["scratch_database", "scratch_topology"]
