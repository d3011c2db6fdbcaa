"""``flash_attention`` for JAX (semantics: core_triton.attention.flash): the
call's plans and index inputs; the differentiable op (a ``custom_vjp``
that skips the gradients JAX does not ask for, and folds ``vmap`` into
the batch) is jax_api._flash.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core_triton.attention import flash as core
from core_triton.attention import flash_call, segment_ranges
from core_triton.common.launch import run_named
from jax_api._flash import attention_call, call_options
from jax_api._fold import foldable
from jax_api._launch import info, launch


def _segment_ranges(q_ids, kv_ids):
    """``(q_key_range [B, 2Tq], kv_query_range [B, 2Tk])`` of segment ids
    ``[B, Tq]`` and ``[B, Tk]`` (core_triton.attention.segment_ranges)."""
    plan = segment_ranges.range_plan(info(q_ids), info(kv_ids), "q_segment_ids", "kv_segment_ids")
    return tuple(launch(plan, {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids}))


# Batch-major ids and ranges: a vmapped axis folds into the batch (one launch).
_ranges = foldable(lambda k: _segment_ranges, lambda elements, in_batched: (True, True))


def index_inputs(plans, q_segment_ids, kv_segment_ids, q_positions, kv_positions, lengths):
    """The index inputs of ``plans``: offsets, segment ids, positions, and
    ``arange`` for a missing position array (``lengths`` = (Tq, Tk))."""
    idx = {"qoff": jnp.asarray(plans.qoff, jnp.int32), "koff": jnp.asarray(plans.koff, jnp.int32)}
    for name, value in (
        ("q_segment_ids", q_segment_ids),
        ("kv_segment_ids", kv_segment_ids),
        ("q_positions", q_positions),
        ("kv_positions", kv_positions),
    ):
        if value is not None:
            idx[name] = jnp.asarray(value)
    for name, n in core.missing_positions(*lengths, q_positions, kv_positions).items():
        idx[name] = jnp.arange(n, dtype=jnp.int32)
    return idx


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    softmax_aux: jax.Array | None = None,
    bias: jax.Array | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    causal: bool = False,
    logits_soft_cap: float | None = None,
    softmax_scale: float | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    return_lse: bool = False,
    cu_seqlens: jax.Array | None = None,
    cu_seqlens_k: jax.Array | None = None,
):
    """Softmax attention.  query ``[B, Tq, HQ, D]``, key ``[B, Tk, H, D]``, value
    ``[B, Tk, H, Dv]`` (one float dtype; ``HQ % H == 0``; D, Dv <= 256) ->
    output ``[B, Tq, HQ, Dv]`` (and ``lse [B, HQ, Tq]`` float32 with
    ``return_lse``).

    Optional, all None/False by default: segment ids int32/int64 ``[B, T]``,
    sinks ``softmax_aux [HQ]`` or ``[HQ, S]``, ``bias [B|1, HQ|1, Tq, Tk]``,
    ``sliding_window`` ``w`` or ``(left, right)``, ``causal``,
    ``logits_soft_cap``, ``softmax_scale`` (default ``D ** -0.5``), positions
    int32/int64 ``[B, T]`` or ``[T]``.  Differentiable in query, key, value,
    softmax_aux and bias; the bias's gradient has its shape and dtype and is
    computed only when JAX differentiates the bias (to use a bias as a
    constant, close over it, leave it out of ``argnums`` or pass
    ``jax.lax.stop_gradient(bias)``).

    Packed input: ``cu_seqlens`` int32/int64 ``[N+1]`` (batch 1) gives the
    sequences' boundaries for queries and keys, or for the queries only when
    ``cu_seqlens_k`` gives the keys' own; within a sequence query ``t`` has
    position ``len_k - len_q + t`` and key ``s`` position ``s`` (a causal
    mask aligned at the end), every other option applies per sequence, and a
    token no sequence covers gets output 0.  Not combined with segment ids
    or positions.

    Reference: docs/api.md#flash_attention"""
    given = {
        "q_segment_ids": q_segment_ids,
        "kv_segment_ids": kv_segment_ids,
        "q_positions": q_positions,
        "kv_positions": kv_positions,
    }
    call = core.AttentionCall.of(locals(), info)  # the call's arguments by name
    plans, return_lse, index, launches = flash_call.call_plans(call)
    made = {}
    if launches and cu_seqlens is None:
        # Segment ids' ranges, made on the device (the ids may be traced).
        q_ids = q_segment_ids if q_segment_ids is not None else kv_segment_ids
        kv_ids = kv_segment_ids if kv_segment_ids is not None else q_segment_ids
        ranges = _ranges(jnp.asarray(q_ids), jnp.asarray(kv_ids))
        made = dict(zip(("q_key_range", "kv_query_range"), ranges, strict=True))
    elif launches:
        # Index arrays made on the device from the boundaries (which may be
        # traced), never differentiated; only those the plans read.
        cu = jnp.asarray(cu_seqlens)
        cu_k = cu if cu_seqlens_k is None else jnp.asarray(cu_seqlens_k)
        made = run_named(launches, {"cu_q": cu, "cu_k": cu_k}, launch)
        made = {n: a for n, a in made.items() if index.get(n) is not None}
        given.update((n, made.pop(n, None)) for n in given)
    idx = index_inputs(plans, *given.values(), (query.shape[1], key.shape[1]))
    idx.update(made)  # the packed ranges
    options = call_options(sliding_window, causal, logits_soft_cap, softmax_scale)
    out, lse = attention_call(options, query, key, value, softmax_aux, bias, idx)
    return (out, lse) if return_lse else out
