"""The version of shardex, apart so modules read it without importing the package."""

__version__ = "0.1.0"
