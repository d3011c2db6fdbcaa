"""A binding's ``flash_attention`` call, planned in one place: packed input
and segment ids (core_triton.attention.packed.prepare), then the attention
(core_triton.attention.flash.plans)."""

from __future__ import annotations

from core_triton.attention import flash, packed
from core_triton.common.launch import LaunchPlan, TensorInfo


def call_plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    cu_seqlens: TensorInfo | None,
    cu_seqlens_k: TensorInfo | None,
    index: dict[str, TensorInfo | None],
    softmax_aux: TensorInfo | None,
    bias: TensorInfo | None,
    sliding_window,
    causal,
    logits_soft_cap,
    softmax_scale,
    return_lse=False,
) -> tuple[flash.AttentionPlans, bool, dict[str, TensorInfo | None], tuple[LaunchPlan, ...]]:
    """``(plans, return_lse, index, launches)``: the attention's plans, the
    infos of the index arrays they read (by name: segment ids, positions,
    ``q_key_range``, ``kv_query_range``) and the launches that make them
    (from the ids' names, or from ``cu_q`` and ``cu_k`` for packed input;
    none when the call gives what the plans read).  ``index``: the infos of
    the call's segment ids and positions by name."""
    index, launches = packed.prepare(query, key, cu_seqlens, cu_seqlens_k, index)
    plans, return_lse = flash.plans(
        query,
        key,
        value,
        index["q_segment_ids"],
        index["kv_segment_ids"],
        softmax_aux,
        bias,
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        index["q_positions"],
        index["kv_positions"],
        return_lse,
        q_key_range=index.get("q_key_range"),
        kv_query_range=index.get("kv_query_range"),
    )
    return plans, return_lse, index, launches
