"""The package version (one place; the top-level package and the dump header read it)."""

__version__ = "0.1.0"
