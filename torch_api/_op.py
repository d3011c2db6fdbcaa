"""One ``torch.autograd.Function`` for every op that core_triton describes
as :class:`core_triton.common.op.OpPlans`."""

from __future__ import annotations

import torch

from core_triton import run_named
from core_triton.common.sequences import chunk_offsets_plan
from torch_api._launch import info, launch


class _Op(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plans, index, *tensors):
        named = {n: t for n, t in zip(plans.inputs, tensors, strict=True) if t is not None}
        env = run_named(plans.forward, {**named, **index}, launch)
        ctx.save_for_backward(*(named[n] for n in plans.saved), *(env[n] for n in plans.residuals))
        ctx.plans, ctx.index = plans, index
        ctx.dtypes = {n: t.dtype for n, t in named.items()}
        ctx.out_dtypes = tuple(env[n].dtype for n in plans.outputs)
        outputs = tuple(env[n] for n in plans.outputs)
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *cotangents):
        plans = ctx.plans
        saved = dict(zip((*plans.saved, *plans.residuals), ctx.saved_tensors, strict=True))
        # Autograd materialises an unused output's cotangent as zeros.
        cts = [c.to(d) for c, d in zip(cotangents, ctx.out_dtypes, strict=True)]
        if plans.contiguous:
            cts = [c.contiguous() for c in cts]
        steps = plans.backward_plans(tuple(info(c) for c in cts))
        env = run_named(
            steps, {**saved, **ctx.index, **dict(zip(plans.cotangents, cts, strict=True))}, launch
        )
        grads = {n: env[out].to(ctx.dtypes[n]) for n, out in plans.grads}
        return None, None, *(grads.get(n) for n in plans.inputs)


def apply(plans, cu_seqlens: torch.Tensor | None, operands: dict):
    """Run ``plans`` on ``operands`` (arrays by input name, None or absent
    where not given) as a differentiable op; returns its outputs."""
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        n_seq = cu_seqlens.shape[0] - 1
        for name, size in plans.offsets:
            step = chunk_offsets_plan(n_seq, plans.seq_len, size, name)
            index[name] = launch(step, {"cu_seqlens": cu_seqlens})[0]
    tensors = [operands.get(n) for n in plans.inputs]
    if plans.contiguous:
        tensors = [None if t is None else t.contiguous() for t in tensors]
    return _Op.apply(plans, index, *tensors)
