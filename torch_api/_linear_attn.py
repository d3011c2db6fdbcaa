"""Autograd plumbing shared by the linear-attention ops: each returns
``core_triton.linear_attn.args.LinearAttnPlans``, and this runs them."""

from __future__ import annotations

import torch

from core_triton import run_named
from core_triton.linear_attn.args import OPERANDS
from torch_api._launch import launch
from torch_api.utils import prepare_chunk_offsets


class _LinearAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plans, index, *operands):
        named = {n: t for n, t in zip(OPERANDS, operands, strict=True) if t is not None}
        env = run_named(plans.forward, {**named, **index}, launch)
        ctx.save_for_backward(*(named[n] for n in plans.inputs), *(env[n] for n in plans.residuals))
        ctx.plans = plans
        ctx.index = index
        return env["o"], env["final"]

    @staticmethod
    def backward(ctx, do, dht):
        plans = ctx.plans
        saved = dict(zip((*plans.inputs, *plans.residuals), ctx.saved_tensors, strict=True))
        # Autograd materialises an unused output's cotangent as zeros.
        cotangents = {"do": do.to(saved["query"].dtype).contiguous(), "dht": dht.float().contiguous()}
        env = run_named(plans.backward, {**saved, **ctx.index, **cotangents}, launch)
        grads = {n: env[out].to(saved[n].dtype) for n, out in plans.grads}
        return None, None, *(grads.get(n) for n in OPERANDS)


def apply(plans, cu_seqlens, operands: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``plans`` on ``operands`` (by argument name, None where absent);
    returns ``(output, final_state)``.  Inputs are made contiguous: the
    kernels read row-major layouts."""
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        for name, size in plans.offsets:
            index[name] = prepare_chunk_offsets(cu_seqlens, size)
    tensors = [None if operands.get(n) is None else operands[n].contiguous() for n in OPERANDS]
    return _LinearAttn.apply(plans, index, *tensors)
