"""``lightning_attn`` for PyTorch (semantics: core_triton.linear_attn.lightning);
the op ``twinkernels::lightning_attn``: ``chunk_linear_attn`` or
``recurrent`` with the depth-dependent ``g_gamma``, a constant made once
per (values, device)."""

from __future__ import annotations

import torch

from core_triton.linear_attn import lightning
from torch_api._launch import device_constant
from torch_api._library import Param, fake_info
from torch_api._op import define

_FLOATS = ("query", "key", "value", "initial_state")


def _make(a, info):
    plans, g_gamma = lightning.plans(
        *(info(a[n]) for n in ("query", "key", "value")), a["layer_idx"], a["num_layers"], a["softmax_scale"],
        info(a["initial_state"]), a["reverse"], info(a["cu_seqlens"]), a["mode"],
    )  # fmt: skip
    operands = {n: a[n] for n in _FLOATS}
    # A fake call (torch.compile's tracing) needs shapes only: no constant.
    if info is not fake_info:
        operands["g_gamma"] = device_constant(g_gamma, torch.float32, a["key"].device)
    return plans, operands


_OP = define(
    "lightning_attn",
    (
        Param("query", "Tensor"),
        Param("key", "Tensor"),
        Param("value", "Tensor"),
        Param("layer_idx", "int"),
        Param("num_layers", "int"),
        Param("softmax_scale", "float?"),
        Param("initial_state", "Tensor?"),
        Param("reverse", "bool"),
        Param("cu_seqlens", "Tensor?"),
        Param("mode", "str"),
    ),
    2,
    _make,
    {n: n for n in _FLOATS},
)


def lightning_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer_idx: int,
    num_layers: int,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    mode: str = "chunk",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention with the per-head constant decay ``g_gamma[h] = -(8 / H)
    * (1 - layer_idx / num_layers) * h``; returns ``(output, final_state)``.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``; ``0
    <= layer_idx < num_layers``; initial_state ``[N, H, K, V]``; cu_seqlens
    int32/int64 ``[N+1]`` for packed input.  Defaults: ``softmax_scale=None``
    (``K ** -0.5``), ``initial_state=None``, ``reverse=False``,
    ``cu_seqlens=None``, ``mode="chunk"`` (or ``"recurrent"``).  Returns
    output ``[B, T, HQ, V]`` and final_state ``[N, H, K, V]`` float32;
    differentiable in query, key, value and initial_state (the decay is a
    constant).

    Reference: docs/api.md#lightning_attn"""
    return _OP(
        query, key, value, layer_idx, num_layers, softmax_scale, initial_state, reverse, cu_seqlens, mode
    )
