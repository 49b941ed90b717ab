"""fleet: run one PyTorch distributed job across a handful of SSH hosts."""

__version__ = "0.1.0"
