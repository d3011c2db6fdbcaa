"""``chunk_local_cumsum`` for PyTorch (semantics: core_triton.cumsum.chunk_local);
the op ``twinkernels::chunk_local_cumsum``."""

from __future__ import annotations

import torch

from core_triton.cumsum import chunk_local as core
from torch_api._launch import dtype_arg
from torch_api._library import Param
from torch_api._op import define


def _make(a, info):
    plans = core.plans(
        info(a["g"]),
        a["chunk_size"],
        a["reverse"],
        a["softmax_scale"],
        info(a["cu_seqlens"]),
        a["head_first"],
        dtype_arg(a["output_dtype"]),
    )
    return plans, {"x": a["g"]}


_OP = define(
    "chunk_local_cumsum",
    (
        Param("g", "Tensor"),
        Param("chunk_size", "int"),
        Param("reverse", "bool"),
        Param("softmax_scale", "float?"),
        Param("cu_seqlens", "Tensor?"),
        Param("head_first", "bool"),
        Param("output_dtype", "ScalarType?"),
    ),
    1,
    _make,
    {"g": "x"},
)


def chunk_local_cumsum(
    g: torch.Tensor,
    chunk_size: int,
    reverse: bool = False,
    softmax_scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    head_first: bool = False,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Inclusive running sums inside windows of ``chunk_size`` tokens that start
    at every sequence's first token (``reverse``: sums to the window's end),
    times ``softmax_scale`` if given.

    g: ``[B, T, H]`` or ``[B, T, H, S]`` float (``[B, H, T(, S)]`` with
    ``head_first``); chunk_size: a positive power of two; cu_seqlens:
    int32/int64 ``[N+1]`` for packed input (``B == 1``).  Defaults:
    ``reverse=False, softmax_scale=None, cu_seqlens=None, head_first=False,
    output_dtype=None`` (g's dtype).  Returns g's shape in ``output_dtype`` (a
    torch.dtype or None); differentiable in ``g``.

    Reference: docs/api.md#chunk_local_cumsum"""
    return _OP(g, chunk_size, reverse, softmax_scale, cu_seqlens, head_first, output_dtype)[0]
