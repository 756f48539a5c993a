"""minilib: small, dependency-free helpers."""

__version__ = "1.4.0"
