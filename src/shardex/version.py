"""The version of shardex (its own module: modules inside the package read it without
importing the package's namespace back)."""

__version__ = "0.1.0"
