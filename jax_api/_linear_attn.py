"""custom_vjp plumbing for linear-attention ops whose plans follow
``core_triton.recurrent.RecurrentPlans``: a forward plan with outputs
``output`` and ``final_state``, backward plans whose named outputs are the
gradients listed in ``core_triton.recurrent.GRADIENTS``."""

from __future__ import annotations

import jax
import numpy as np

from core_triton import run_named
from core_triton.recurrent import GRADIENTS
from jax_api._launch import launch


def apply(plans, cu_seqlens, operands: dict) -> tuple[jax.Array, jax.Array]:
    """Run ``plans`` on ``operands`` (by argument name, None where absent);
    returns ``(output, final_state)``."""
    operands = {n: operands[n] for n in plans.inputs}
    index = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}

    @jax.custom_vjp
    def op(operands, index):
        env = run_named((plans.forward,), {**operands, **index}, launch)
        return env["output"], env["final_state"]

    def fwd(operands, index):
        return op(operands, index), (operands, index)

    def bwd(residuals, cotangents):
        operands, index = residuals
        d_output, d_final_state = cotangents
        env = run_named(
            plans.backward,
            {**operands, **index, "d_output": d_output, "d_final_state": d_final_state},
            launch,
        )
        grads = {n: env[GRADIENTS[n]] for n in operands}
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index)
        return grads, zeros

    op.defvjp(fwd, bwd)
    return op(operands, index)
