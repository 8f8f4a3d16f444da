"""effect-ledger: the effect ledger and final gate that agent runtimes call before every side effect."""

__version__ = "0.1.0"
