"""custom_vjp plumbing shared by the linear-attention ops: each returns
``core_triton.linear_attn.args.LinearAttnPlans``, and this runs them."""

from __future__ import annotations

import jax
import numpy as np

from core_triton import run_named
from jax_api._launch import launch
from jax_api.utils import prepare_chunk_offsets


def apply(plans, cu_seqlens, operands: dict) -> tuple[jax.Array, jax.Array]:
    """Run ``plans`` on ``operands`` (by argument name, None where absent);
    returns ``(output, final_state)``.  ``cu_seqlens`` may be traced."""
    operands = {n: operands[n] for n in plans.inputs}
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        for name, size in plans.offsets:
            index[name] = prepare_chunk_offsets(cu_seqlens, size)

    def forward(operands, index):
        env = run_named(plans.forward, {**operands, **index}, launch)
        return (env["o"], env["final"]), {n: env[n] for n in plans.residuals}

    @jax.custom_vjp
    def op(operands, index):
        return forward(operands, index)[0]

    def fwd(operands, index):
        outputs, residuals = forward(operands, index)
        return outputs, (operands, index, residuals)

    def bwd(saved, cotangents):
        operands, index, residuals = saved
        do, dht = cotangents
        cotangents = {"do": do.astype(operands["query"].dtype), "dht": dht}
        env = run_named(plans.backward, {**operands, **index, **residuals, **cotangents}, launch)
        grads = {n: env[out].astype(operands[n].dtype) for n, out in plans.grads}
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index)
        return grads, zeros

    op.defvjp(fwd, bwd)
    return op(operands, index)
