"""Autograd plumbing for linear-attention ops whose plans follow
``core_triton.recurrent.RecurrentPlans``: a forward plan with outputs
``output`` and ``final_state``, backward plans whose named outputs are the
gradients listed in ``core_triton.recurrent.GRADIENTS``."""

from __future__ import annotations

import torch

from core_triton import run_named
from core_triton.recurrent import GRADIENTS
from torch_api._launch import launch

OPERANDS = tuple(GRADIENTS)  # query, key, value, g, g_gamma, gk, gv, initial_state


class _LinearAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plans, index, *operands):
        named = {n: t for n, t in zip(OPERANDS, operands, strict=True) if t is not None}
        env = run_named((plans.forward,), {**named, **index}, launch)
        ctx.save_for_backward(*(named[n] for n in plans.inputs))
        ctx.plans = plans
        ctx.index = index
        return env["output"], env["final_state"]

    @staticmethod
    def backward(ctx, d_output, d_final_state):
        saved = dict(zip(ctx.plans.inputs, ctx.saved_tensors, strict=True))
        cotangents = {"d_output": d_output.contiguous(), "d_final_state": d_final_state.contiguous()}
        env = run_named(ctx.plans.backward, {**saved, **ctx.index, **cotangents}, launch)
        return None, None, *(env[GRADIENTS[n]] if n in saved else None for n in OPERANDS)


def apply(plans, cu_seqlens, operands: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``plans`` on ``operands`` (by argument name, None where absent);
    returns ``(output, final_state)``.  Inputs are made contiguous: the
    kernels read row-major layouts."""
    index = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    tensors = [None if operands.get(n) is None else operands[n].contiguous() for n in OPERANDS]
    return _LinearAttn.apply(plans, index, *tensors)
