"""One ``jax.custom_vjp`` runner for every op that core_triton describes as
:class:`core_triton.common.op.OpPlans`."""

from __future__ import annotations

import jax
import numpy as np

from core_triton import run_named
from core_triton.common.sequences import chunk_offsets_plan
from jax_api._launch import info, launch


def apply(plans, cu_seqlens, operands: dict):
    """Run ``plans`` on ``operands`` (arrays by input name, None or absent
    where not given) as a differentiable op; returns its outputs.
    ``cu_seqlens`` may be traced."""
    operands = {n: operands[n] for n in plans.inputs if operands.get(n) is not None}
    dtypes = {n: a.dtype for n, a in operands.items()}
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        n_seq = cu_seqlens.shape[0] - 1
        for name, size in plans.offsets:
            step = chunk_offsets_plan(n_seq, plans.seq_len, size, name)
            index[name] = launch(step, {"cu_seqlens": cu_seqlens})[0]

    def forward(operands, index):
        env = run_named(plans.forward, {**operands, **index}, launch)
        outputs = tuple(env[n] for n in plans.outputs)
        saved = {n: operands[n] for n in plans.saved}
        return outputs, (saved, index, {n: env[n] for n in plans.residuals})

    @jax.custom_vjp
    def op(operands, index):
        return forward(operands, index)[0]

    def bwd(res, cotangents):
        saved, index, residuals = res
        cts = [c.astype(plans.output_dtype(n)) for c, n in zip(cotangents, plans.outputs, strict=True)]
        steps = plans.backward_plans(tuple(info(c) for c in cts))
        named = dict(zip(plans.cotangents, cts, strict=True))
        env = run_named(steps, {**saved, **index, **residuals, **named}, launch)
        grads = {n: env[out].astype(dtypes[n]) for n, out in plans.grads}
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index)
        return grads, zeros

    op.defvjp(forward, bwd)
    outputs = op(operands, index)
    return outputs if len(outputs) > 1 else outputs[0]
