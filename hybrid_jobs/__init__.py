"""hybrid-jobs: background jobs on a PostgreSQL job table, woken through RabbitMQ by a
transactional outbox.

The one package this project installs. Its parts are imported by name::

    from hybrid_jobs import outbox       # enqueue in your own transaction (producers)
    from hybrid_jobs import consumers    # @consumers.handler, run by `consumer --app`

``relay``, ``jobctl``, ``schema`` (tables and statements) and ``plumbing`` (settings,
connections, logging) are the rest. In the repository each part keeps its own folder at
the top level; the build maps them in here, so nothing else is installed at the top.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hybrid-jobs")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
