"""nmt-cli's version (saved in every checkpoint and data directory)."""

__version__ = "0.1.0"
