"""``zigzag_reorder`` / ``zigzag_restore`` for PyTorch: the zig-zag layout of
``ring_attention``'s shards (core_triton.attention.ring.zigzag_order)."""

from __future__ import annotations

import torch

from core_triton.attention import ring as core
from torch_api._ring import layout


def zigzag_reorder(x: torch.Tensor, ring_size: int, axis: int = 1) -> torch.Tensor:
    """Global sequence -> zig-zag layout along ``axis`` (default 1): shard ``r``
    of an equal split in ``n = ring_size`` holds chunks ``r`` and ``2n-1-r``
    of ``2n``.  ``x.shape[axis]`` must be a multiple of ``2 * ring_size``
    (``ValueError``).

    Reference: docs/api.md#zigzag_reorder"""
    core.zigzag_order(ring_size, x.shape[axis])  # ValueError/TypeError naming ring_size
    return x.index_select(axis, layout(int(ring_size), x.shape[axis], True, x.device)[0])


def zigzag_restore(x: torch.Tensor, ring_size: int, axis: int = 1) -> torch.Tensor:
    """Inverse of ``zigzag_reorder``: zig-zag layout along ``axis`` (default 1)
    back to the global order.

    Reference: docs/api.md#zigzag_restore"""
    core.zigzag_order(ring_size, x.shape[axis])  # ValueError/TypeError naming ring_size
    return x.index_select(axis, layout(int(ring_size), x.shape[axis], True, x.device)[1])
