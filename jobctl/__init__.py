"""The operator's surface: the ``jobctl`` command line (and, later, the HTTP API, the
metrics collector and the dashboard), all reading and steering the tables."""
