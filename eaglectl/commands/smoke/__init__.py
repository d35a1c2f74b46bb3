"""`eaglectl smoke`: acceptance measured by the reference loop, vLLM in its own interpreter, or a running server."""
