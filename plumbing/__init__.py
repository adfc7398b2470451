"""Process plumbing shared by `relay`, `consumer` and `jobctl`: settings and URLs,
connection pools, transient-error retry, JSON logging, command-line helpers."""
