"""Re-exported from harness.services, where the benchmarks import it too."""

from harness.services import ADMIN_URL, AMQP_URL, postgres_problem, problems, rabbitmq_problem

__all__ = ["ADMIN_URL", "AMQP_URL", "postgres_problem", "problems", "rabbitmq_problem"]
