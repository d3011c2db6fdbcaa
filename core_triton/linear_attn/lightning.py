"""``lightning_attn``: linear attention with a per-head constant decay set by
the layer's depth (lightning attention of TransNormer / MiniMax).

``g_gamma[h] = -(8 / H) * (1 - layer_idx / num_layers) * h`` for the ``H``
state heads: head 0 never decays, and deeper layers decay less.  The op is
``chunk_linear_attn`` (``mode="chunk"``) or ``recurrent``
(``mode="recurrent"``) with that ``g_gamma``; the decay is a constant, so it
gets no gradient.
"""

from __future__ import annotations

import numbers

import numpy as np

from core_triton.common import checks
from core_triton.common.launch import TensorInfo
from core_triton.common.op import OpPlans
from core_triton.linear_attn import chunk, recurrent

MODES = ("chunk", "recurrent")


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def decay(key: TensorInfo, layer_idx, num_layers, mode) -> tuple[np.ndarray, str]:
    """Check the lightning-specific arguments; returns ``(g_gamma, mode)``
    with ``g_gamma`` ``[H]`` float32 for key ``[B, T, H, K]``."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    layer_idx = _int(layer_idx, "layer_idx")
    num_layers = _int(num_layers, "num_layers")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx must be in [0, num_layers) = [0, {num_layers}), got {layer_idx}")
    checks.check_rank(key, "key", (4,), "4-D [batch, seq_len, heads, head_dim]")
    H = key.shape[2]
    heads = np.arange(H, dtype=np.float64)
    g_gamma = -(8.0 / max(H, 1)) * (1.0 - layer_idx / num_layers) * heads
    return g_gamma.astype(np.float32), mode


def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    layer_idx,
    num_layers,
    softmax_scale=None,
    initial_state: TensorInfo | None = None,
    reverse=False,
    cu_seqlens: TensorInfo | None = None,
    mode="chunk",
) -> tuple[OpPlans, tuple[float, ...]]:
    """Check the arguments and plan the op: ``(plans, g_gamma)``, the plans
    of ``chunk_linear_attn`` or ``recurrent`` with the decay as their input
    ``g_gamma`` (``[H]`` float32, given here as its values for the binding
    to make once per device; it gets no gradient: the chunk plans compute
    none)."""
    g_gamma, mode = decay(key, layer_idx, num_layers, mode)
    gamma = TensorInfo(g_gamma.shape, "float32", (1,), key.device)
    if mode == "chunk":
        op_plans = chunk.plans(
            query, key, value, None, gamma, softmax_scale, initial_state, reverse, cu_seqlens,
            gamma_grad=False,
        )  # fmt: skip
    else:
        op_plans = recurrent.plans(
            query, key, value, None, gamma, None, None, softmax_scale, initial_state, reverse, cu_seqlens
        )  # fmt: skip
    return op_plans, tuple(g_gamma.tolist())
