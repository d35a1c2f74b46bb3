"""`eaglectl convert`: the plan (pure), the writer (streamed, staged, re-checked), the GGUF writer."""
