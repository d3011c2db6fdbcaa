"""``chunk_global_cumsum`` for PyTorch (semantics: core_triton.cumsum.chunk_global);
the op ``twinkernels::chunk_global_cumsum``."""

from __future__ import annotations

import torch

from core_triton.cumsum import chunk_global as core
from torch_api._launch import dtype_arg
from torch_api._library import Param
from torch_api._op import define


def _make(a, info):
    plans = core.plans(
        info(a["s"]),
        a["reverse"],
        info(a["cu_seqlens"]),
        a["softmax_scale"],
        a["head_first"],
        dtype_arg(a["output_dtype"]),
    )
    return plans, {"x": a["s"]}


_OP = define(
    "chunk_global_cumsum",
    (
        Param("s", "Tensor"),
        Param("reverse", "bool"),
        Param("cu_seqlens", "Tensor?"),
        Param("softmax_scale", "float?"),
        Param("head_first", "bool"),
        Param("output_dtype", "ScalarType?"),
    ),
    1,
    _make,
    {"s": "x"},
)


def chunk_global_cumsum(
    s: torch.Tensor,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    head_first: bool = False,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Inclusive prefix sums over each whole sequence (``reverse``: suffix sums),
    times ``softmax_scale`` if given.

    s: ``[B, T, H]`` or ``[B, T, H, S]`` float (``[B, H, T(, S)]`` with
    ``head_first``); cu_seqlens: int32/int64 ``[N+1]`` for packed input (``B
    == 1``).  Defaults: ``reverse=False, cu_seqlens=None, softmax_scale=None,
    head_first=False, output_dtype=None`` (s's dtype). Returns s's shape in
    ``output_dtype`` (a torch.dtype or None); differentiable in ``s``.

    Reference: docs/api.md#chunk_global_cumsum"""
    return _OP(s, reverse, cu_seqlens, softmax_scale, head_first, output_dtype)[0]
