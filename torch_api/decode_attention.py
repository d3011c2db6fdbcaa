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
from torch_api._library import check_tensors, fake_info, forward_only_op


def _plans(info_of, args):
    """The launch plans of ``args`` (the op's arguments in order)."""
    query, key_cache, value_cache, kv_lens, block_table, scale, window, cap, sinks = args
    return core.decode_plans(
        info_of(query, "query"), info_of(key_cache, "key_cache"), info_of(value_cache, "value_cache"),
        info_of(kv_lens, "kv_lens"), info_of(block_table, "block_table"), scale,
        None if window is None else tuple(window), cap, info_of(sinks, "softmax_aux"),
    )  # fmt: skip


def _run(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor | None,
    softmax_scale: float | None,
    sliding_window: list[int] | None,
    logits_soft_cap: float | None,
    softmax_aux: torch.Tensor | None,
) -> torch.Tensor:
    """The launches (eager calls run this directly; it is also the custom
    op's implementation)."""
    args = (query, key_cache, value_cache, kv_lens, block_table, softmax_scale, sliding_window,
            logits_soft_cap, softmax_aux)  # fmt: skip
    sinks = None if softmax_aux is None else softmax_aux.contiguous()  # read with unit stride
    inputs = core.step_inputs(query, key_cache, value_cache, kv_lens, block_table, sinks)
    return run_steps(_plans(info, args), inputs, launch)[0]


_op = forward_only_op(
    "decode_attention",
    _run,
    lambda *args: _plans(lambda t, name: fake_info(t), args)[-1].outputs[0],  # the last launch's first output
)


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
    args = (
        query,
        key_cache,
        value_cache,
        kv_lens,
        block_table,
        softmax_scale,
        window,
        logits_soft_cap,
        softmax_aux,
    )
    named = dict(query=query, key_cache=key_cache, value_cache=value_cache, kv_lens=kv_lens,
                 block_table=block_table, softmax_aux=softmax_aux)  # fmt: skip
    check_tensors(named)
    return _op(*args)
