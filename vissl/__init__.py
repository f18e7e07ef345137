"""vissl: a modern rebuild of VISSL, the self-supervised vision training library."""

__version__ = "0.2.0"
