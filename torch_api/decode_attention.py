"""``decode_attention`` for PyTorch (semantics: core_triton.attention.decode);
the op ``twinkernels::decode_attention``, forward only.

Two launches: the split-KV kernel, then the combine.  Eager calls launch
directly; under ``torch.compile`` / ``torch.export`` the call is one
custom-op node whose fake implementation gives the output's shape and dtype.
"""

from __future__ import annotations

import torch

from core_triton.attention import decode as core
from core_triton.attention import flash
from core_triton.common.launch import run_steps
from torch_api._launch import info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info

PARAMS = (
    Param("query", "Tensor"),
    Param("key_cache", "Tensor"),
    Param("value_cache", "Tensor"),
    Param("kv_lens", "Tensor"),
    Param("block_table", "Tensor?"),
    Param("softmax_scale", "float?"),
    Param("sliding_window", "int[]?"),
    Param("logits_soft_cap", "float?"),
    Param("softmax_aux", "Tensor?"),
)


def _plans(info_of, a):
    """The launch plans of the op's arguments ``a`` (by name);
    ``info_of(tensor, name)``."""
    window = a["sliding_window"]
    tensors = (info_of(a[n], n) for n in ("query", "key_cache", "value_cache", "kv_lens", "block_table"))
    window = None if window is None else tuple(window)
    sinks = info_of(a["softmax_aux"], "softmax_aux")
    return core.decode_plans(*tensors, a["softmax_scale"], window, a["logits_soft_cap"], sinks)


def _run(a):
    """The launches: the split-KV kernel, then the combine."""
    cache = (a[n] for n in ("query", "key_cache", "value_cache", "kv_lens", "block_table"))
    sinks = None if a["softmax_aux"] is None else a["softmax_aux"].contiguous()  # read with unit stride
    return (run_steps(_plans(info, a), core.step_inputs(*cache, sinks), launch)[0],)


def _fake(a):
    spec = _plans(lambda t, name: fake_info(t), a)[-1].outputs[0]  # the last launch's first output
    return (torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=a["query"].device),)


_OP = TorchOp("decode_attention", PARAMS, 1, Impl.forward_only(_run, _fake))


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    softmax_aux: torch.Tensor | None = None,
):
    """Attention of a few new queries against a KV cache, forward only.
    query ``[B, Tq, HQ, D]`` (Tq 1 to 16); a contiguous cache ``key_cache
    [B, S, H, D]``, ``value_cache [B, S, H, Dv]``, or paged caches
    ``[num_blocks, page_size, H, D]`` with ``block_table [B, max_blocks]``
    int32; ``kv_lens [B]`` int32, each row's valid length -> output ``[B,
    Tq, HQ, Dv]`` in the query's dtype.

    Query ``t`` of row ``b`` has position ``kv_lens[b] - Tq + t`` (the new
    tokens are the cache's last ``Tq``) and sees keys ``0 ..`` its position
    (causal among themselves), within ``sliding_window`` (``w`` or ``(left,
    right)``; only ``left`` matters) if given.  ``softmax_scale`` (default
    ``D ** -0.5``), ``logits_soft_cap`` and sinks ``softmax_aux [HQ]`` or
    ``[HQ, S]`` as in ``flash_attention``.  A query with no allowed key
    (``kv_lens`` 0) gets output 0.  ``kv_lens`` and page indices are read on
    the device only and clamped into the cache.

    Reference: docs/api.md#decode_attention"""
    window = flash.window_pair(sliding_window)
    args = (query, key_cache, value_cache, kv_lens, block_table, softmax_scale, window, logits_soft_cap)
    return _OP(*args, softmax_aux)[0]
