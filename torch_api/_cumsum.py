"""Autograd plumbing shared by the two cumsum ops."""

from __future__ import annotations

import torch

from core_triton import run_steps
from torch_api._launch import info, launch
from torch_api.utils import prepare_chunk_offsets


def _index_inputs(cu_seqlens, plans) -> dict[str, torch.Tensor]:
    if cu_seqlens is None:
        return {}
    inputs = {"cu_seqlens": cu_seqlens}
    if plans.offsets_chunk_size is not None:
        inputs["chunk_offsets"] = prepare_chunk_offsets(cu_seqlens, plans.offsets_chunk_size)
    return inputs


class _SegmentCumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, index_inputs, plans):
        (y,) = run_steps(plans.forward, {"x": x, **index_inputs}, launch)
        ctx.index_inputs = index_inputs
        ctx.plans = plans
        return y

    @staticmethod
    def backward(ctx, dy):
        (dx,) = run_steps(ctx.plans.backward(info(dy)), {"x": dy, **ctx.index_inputs}, launch)
        return dx, None, None


def segment_cumsum(x: torch.Tensor, cu_seqlens, plans) -> torch.Tensor:
    """Run a cumsum's forward plan; its backward plan gives the gradient of
    ``x`` (the index inputs get none)."""
    return _SegmentCumsum.apply(x, _index_inputs(cu_seqlens, plans), plans)
