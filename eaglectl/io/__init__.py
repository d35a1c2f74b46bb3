"""File access that never imports torch at module level: safetensors headers and bytes, bounded
JSON, checkpoints (local, sharded, pickle, Hub) and all-or-nothing output."""
