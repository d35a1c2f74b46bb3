"""Bounds eaglectl enforces on untrusted input, declared once as data.

Every file eaglectl reads may be hostile: a header of nested arrays, a config asking for 10⁸
layers, a 100,000-element aux list, a capture with a token id of 10¹², a prompt file of one 2 GB
line, a server that never answers. A value beyond a bound is an input problem with a one-line
message naming where it is (a corrupt header, a `config-field-invalid` finding, or the error of
that input surface: invalid-states, prompt-file, manifest, server-reply) — never a crash, a
memory blow-up or a minute of work. `docs/errors.md` renders this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    value: int
    applies_to: str


LIMITS: dict[str, Limit] = {
    "header_bytes": Limit(100_000_000, "safetensors JSON header (the safetensors reference's own cap)"),
    "json_bytes": Limit(64 * 2**20, "config.json, shard index, manifest, capture.json"),
    "json_depth": Limit(64, "nesting of any JSON document (headers, configs, indexes, manifests)"),
    "tensors_per_file": Limit(200_000, "tensors in one safetensors header"),
    "tensor_name_chars": Limit(1024, "characters in a tensor name"),
    "tensor_rank": Limit(8, "dimensions of one tensor"),
    "tensor_dim": Limit(2**40, "one dimension of a tensor shape"),
    "drafter_layers": Limit(256, "num_hidden_layers of a drafter"),
    "target_layers": Limit(4096, "num_hidden_layers of a target"),
    "aux_ids": Limit(64, "entries in an aux-layer-id list"),
    "draft_block": Limit(1024, "block_size of a DFlash / DSpark drafter (its drafts per pass, plus one)"),
    "config_int": Limit(2**40, "any other integer config field (sizes, vocab, positions)"),
    "config_string_chars": Limit(4096, "characters in a config string field"),
    "quant_scale_bytes": Limit(1 << 20, "bytes of one quantisation scale inspect reads without --scan (--scan: all)"),
    # GGUF headers (llama.cpp's own rules, GGML_MAX_DIMS and the rest, are the format's: io/gguf.py)
    "gguf_kv": Limit(65_536, "key-value pairs in one GGUF header"),
    "gguf_string_bytes": Limit(16 << 20, "bytes of one GGUF key or string value"),
    "gguf_array_items": Limit(1 << 22, "items of one GGUF array value (a tokenizer's vocabulary, merges)"),
    "folder_entries": Limit(10_000, "files directly inside a checkpoint folder"),
    "quant_exclusions": Limit(10_000, "entries of a quantisation ignore / exclude_modules list"),
    # folders walked whole: a SPEED-Bench --prompts folder, the folder `upload` sends
    "tree_depth": Limit(32, "levels of sub-folders under a SPEED-Bench --prompts folder or a folder `upload` sends"),
    "tree_entries": Limit(100_000, "files and folders under a SPEED-Bench --prompts folder or a folder `upload` sends"),
    # what `check` and `upload` read of the files they publish
    "card_bytes": Limit(8 << 20, "bytes of a model card (README.md) that check reads and lints"),
    "publish_scan_bytes": Limit(8 << 20, "bytes of a file searched for local paths before upload (larger text "
                                         "files are sent, hashed in chunks, but not searched)"),
    "profile_bytes": Limit(4 << 20, "bytes of a speculation_profile.json"),
    "calibration_text_bytes": Limit(8 << 20, "bytes of a --calibration-text (upgrade) or --text (verify) file"),
    "weight_files": Limit(10_000, "weight files listed by one shard index"),
    # captures (--states): capture.json + one safetensors per request
    "capture_requests": Limit(1_000_000, "request files (*.safetensors) in one capture folder"),
    "capture_tokens": Limit(1 << 20, "tokens of one captured request"),
    "capture_layers": Limit(4097, "boundaries in one capture (0..L of the deepest target)"),
    "state_abs": Limit(10**9, "largest |value| of a captured hidden state (real states stay far below it; beyond it is a broken capture)"),
    # prompt files (--prompts FILE.jsonl or a SPEED-Bench folder)
    "prompt_file_bytes": Limit(1 << 30, "bytes of one JSONL prompt file or SPEED-Bench parquet file"),
    "prompt_line_bytes": Limit(16 << 20, "bytes of one JSONL prompt line"),
    "prompts_per_file": Limit(1_000_000, "prompts (lines, rows) read from one prompt file or folder"),
    "prompt_tokens": Limit(1 << 20, "tokens of one prompt (prompt_token_ids, or the tokenized text)"),
    "prompt_messages": Limit(1024, "chat messages in one prompt line"),
    "prompt_token_bytes": Limit(64, "bytes of prompt text per token the prompt may have, checked before tokenizing (a "
                                    "text longer than that for the tokens max_model_len leaves it is refused)"),
    # batch manifests (--manifest)
    "manifest_entries": Limit(10_000, "items in one batch manifest"),
    # a running server (smoke --server, capture --engine server)
    "server_reply_bytes": Limit(256 << 20, "bytes of one HTTP reply (JSON or /metrics text)"),
    "http_connect_timeout_s": Limit(10, "seconds to connect to a server"),
    "http_read_timeout_s": Limit(3600, "seconds one reply may take (the command's --timeout-s may be shorter)"),
    "http_redirects": Limit(3, "redirects followed per request (same host only; another host is refused)"),
    "server_total_s": Limit(7 * 86400, "seconds a whole server-driving command may take (--timeout-s is lower)"),
    # an engine's reading worker (the engine's own code asked what it reads): its answers are untrusted input too
    "engine_answer_s": Limit(600, "seconds one question to an engine's reading worker may take, every wait in it "
                                  "bounded (EAGLECTL_ENGINE_TIMEOUT=SECONDS lowers it)"),
    "engine_answer_bytes": Limit(64 << 20, "bytes of one answer line from an engine's reading worker"),
    "log_tail_bytes": Limit(64 << 10, "bytes of a worker's log read for the hint when it fails (its end)"),
}


def limit(name: str) -> int:
    return LIMITS[name].value
