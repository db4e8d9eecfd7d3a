"""deepinit: initialization and normalization schemes for deep Transformers."""
__version__ = "0.1.0"
