"""vLLM's ExampleHiddenStatesConnector on the CPU: its write step uses a CUDA copy stream, CUDA
events and pinned memory, which a CPU build has none of. This subclass copies the hidden states
out of the cache and writes them synchronously; everything else (lock files, file names, the
hidden_states [T, n, H] + token_ids layout) is vLLM's own. Loaded by vLLM through
kv_connector_module_path."""
from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, extract_from_kv_cache)


class _Done:
    """Stands in for the CUDA event get_finished polls: the write is already done."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size, dtype=torch.long)[None, :]
                 + blocks[:, None] * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": hidden.contiguous().clone(),
                       "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
