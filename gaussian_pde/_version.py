"""The package version (a leaf module: sweeps compare it across workers)."""

__version__ = "0.12.1"
