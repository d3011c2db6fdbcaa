"""``recurrent`` for PyTorch (semantics: core_triton.linear_attn.recurrent);
the op ``twinkernels::recurrent``."""

from __future__ import annotations

import torch

from core_triton.linear_attn import recurrent as core
from torch_api._library import Param
from torch_api._op import define

_FLOATS = ("query", "key", "value", "g", "g_gamma", "gk", "gv", "initial_state")


def _make(a, info):
    plans = core.plans(
        *(info(a[n]) for n in ("query", "key", "value", "g", "g_gamma", "gk", "gv")),
        a["softmax_scale"],
        info(a["initial_state"]),
        a["reverse"],
        info(a["cu_seqlens"]),
    )
    return plans, {n: a[n] for n in _FLOATS}


_OP = define(
    "recurrent",
    (
        Param("query", "Tensor"),
        Param("key", "Tensor"),
        Param("value", "Tensor"),
        Param("g", "Tensor?"),
        Param("g_gamma", "Tensor?"),
        Param("gk", "Tensor?"),
        Param("gv", "Tensor?"),
        Param("softmax_scale", "float?"),
        Param("initial_state", "Tensor?"),
        Param("reverse", "bool"),
        Param("cu_seqlens", "Tensor?"),
    ),
    2,
    _make,
    {n: n for n in _FLOATS},
)


def recurrent(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention, token by token: returns ``(output, final_state)``.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``
    (float32/bfloat16/float16, one dtype; ``HQ % H == 0``; K, V <= 256);
    optional log-space gates g ``[B, T, H]``, g_gamma ``[H]``, gk ``[B, T, H,
    K]``, gv ``[B, T, H, V]``; initial_state ``[N, H, K, V]`` (``N = B`` or
    the number of packed sequences); cu_seqlens int32/int64 ``[N+1]`` for
    packed input (``B == 1``).  Defaults: every optional input None,
    ``softmax_scale=None`` (``K ** -0.5``), ``reverse=False``.  Returns output
    ``[B, T, HQ, V]`` (query's dtype) and final_state ``[N, H, K, V]``
    float32; differentiable in every float input.

    Reference: docs/api.md#recurrent"""
    return _OP(query, key, value, g, g_gamma, gk, gv, softmax_scale, initial_state, reverse, cu_seqlens)
