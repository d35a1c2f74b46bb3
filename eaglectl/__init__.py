"""eaglectl: inspect, convert, upgrade, verify and smoke-test EAGLE-3 / EAGLE-3.1 drafter checkpoints."""

__version__ = "0.1.0.dev0"

__all__ = ["__version__"]
