"""custom_vjp plumbing shared by the two cumsum ops."""

from __future__ import annotations

import jax
import numpy as np

from core_triton import run_steps
from jax_api._launch import info, launch
from jax_api.utils import prepare_chunk_offsets


def _index_inputs(cu_seqlens, plans) -> dict[str, jax.Array]:
    if cu_seqlens is None:
        return {}
    inputs = {"cu_seqlens": cu_seqlens}
    if plans.offsets_chunk_size is not None:
        inputs["chunk_offsets"] = prepare_chunk_offsets(cu_seqlens, plans.offsets_chunk_size)
    return inputs


def segment_cumsum(x: jax.Array, cu_seqlens, plans) -> jax.Array:
    """Run a cumsum's forward plan; its backward plan gives the gradient of
    ``x`` (the index inputs get float0 zeros)."""

    @jax.custom_vjp
    def op(x, index_inputs):
        return run_steps(plans.forward, {"x": x, **index_inputs}, launch)[0]

    def fwd(x, index_inputs):
        return op(x, index_inputs), index_inputs

    def bwd(index_inputs, dy):
        dx = run_steps(plans.backward(info(dy)), {"x": dy, **index_inputs}, launch)[0]
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index_inputs)
        return dx, zeros

    op.defvjp(fwd, bwd)
    return op(x, _index_inputs(cu_seqlens, plans))
