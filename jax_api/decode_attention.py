"""``decode_attention`` for JAX (semantics: core_triton.attention.decode),
forward only: the split-KV launch, then the combine (none when each row and
head takes one slice).  ``kv_lens`` and the
block table may be traced."""

from __future__ import annotations

import jax

from core_triton.attention import decode as core
from core_triton.attention import flash
from core_triton.common.launch import run_steps
from jax_api._launch import info, launch


def decode_attention(
    query: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    kv_lens: jax.Array,
    block_table: jax.Array | None = None,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    softmax_aux: jax.Array | None = None,
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
    steps = core.decode_plans(
        info(query, "query"), info(key_cache, "key_cache"), info(value_cache, "value_cache"),
        info(kv_lens, "kv_lens"), info(block_table, "block_table"), softmax_scale,
        None if window is None else tuple(window), logits_soft_cap, info(softmax_aux, "softmax_aux"),
    )  # fmt: skip
    inputs = core.step_inputs(query, key_cache, value_cache, kv_lens, block_table, softmax_aux)
    return run_steps(steps, inputs, launch)[0]
