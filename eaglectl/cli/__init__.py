"""The terminal: the Click app, its parameter types, batch manifests, the output sink, consoles, interrupts, views."""
