"""The API's routes, by subject; each one a thin layer over jobctl.service."""
