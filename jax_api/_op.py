"""One ``jax.custom_vjp`` runner for every op that core_triton describes as
:class:`core_triton.common.op.OpPlans`.

Under ``vmap`` the op folds the vmapped axis into its batch axis and
launches once (jax_api._fold): the forward and the backward are foldable
functions inside the ``custom_vjp``, planned again for the folded batch.
Every input but the ``shared`` ones (``g_gamma [H]``) is batch-major, and
so is every output, residual and cotangent of an unpacked call; packed
input (``cu_seqlens``: a batch of 1 that the offsets index) does not fold.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from core_triton import TensorInfo, run_named
from core_triton.common import reductions
from core_triton.common.op import OpPlans
from core_triton.common.runtime import is_interpreted
from core_triton.common.sequences import chunk_offsets_plan
from core_triton.common.utils import contiguous_strides
from jax_api._fold import foldable, side_by_side
from jax_api._launch import info, launch


def apply(
    plan: Callable[[dict[str, TensorInfo]], OpPlans],
    cu_seqlens,
    operands: dict,
    shared: tuple[str, ...] = (),
):
    """Run the op that ``plan`` plans on ``operands`` (arrays by input name,
    None or absent where not given) as a differentiable op; returns its
    outputs.  ``plan(infos)``: the op's plans for the operands' TensorInfos
    (by the same names), called again for a folded batch under ``vmap``.
    ``shared``: operands without a batch axis.  ``cu_seqlens`` may be
    traced."""
    given = {n: a for n, a in operands.items() if a is not None}
    infos = {n: info(a, n) for n, a in given.items()}
    plans = plan(infos)
    operands = {n: given[n] for n in plans.inputs if n in given}
    dtypes = {n: a.dtype for n, a in operands.items()}
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        n_seq = cu_seqlens.shape[0] - 1
        for name, size in plans.offsets:
            step = chunk_offsets_plan(n_seq, plans.seq_len, size, name)
            index[name] = launch(step, {"cu_seqlens": cu_seqlens})[0]

    def planned(k):
        """The plans for inputs folded ``k`` times."""
        return plans if k == 1 else plan(_folded(infos, k, shared))

    def make_forward(k):
        p = planned(k)

        def forward(operands, index):
            env = run_named(p.forward, {**operands, **index}, launch)
            return tuple(env[n] for n in p.outputs), {n: env[n] for n in p.residuals}

        return forward

    def make_inference(k):
        p = planned(k)

        def inference(operands, index):
            env = run_named(p.forward_only, {**operands, **index}, launch)
            return tuple(env[n] for n in p.outputs)

        return inference

    def make_backward(k):
        p = planned(k)

        def backward(saved, index, residuals, cotangents):
            cts = [c.astype(p.output_dtype(n)) for c, n in zip(cotangents, p.outputs, strict=True)]
            steps = p.backward_plans(tuple(info(c) for c in cts))
            per_element = {n: out for n, out in p.grads if n in shared and k > 1}
            steps, sums = _without_head_sums(steps, per_element)
            named = dict(zip(p.cotangents, cts, strict=True))
            env = run_named(steps, {**saved, **index, **residuals, **named}, launch)
            grads = {n: env[out].astype(dtypes[n]) for n, out in p.grads if n not in per_element}
            for n, source in sums.items():
                grads[n] = _head_sum_per_element(env, source, k).astype(dtypes[n])
            return grads

        return backward

    if cu_seqlens is None:

        def layout(elements, in_batched):
            ops = {n: n not in shared for n in elements[0]}
            return (ops, {n: False for n in elements[1]}, *(_all_major(a) for a in elements[2:]))

        forward, backward = foldable(make_forward, layout), foldable(make_backward, layout)
        inference = foldable(make_inference, layout)
    else:
        forward, backward, inference = make_forward(1), make_backward(1), make_inference(1)

    # The primal: what JAX runs when it does not differentiate the op.
    @jax.custom_vjp
    def op(operands, index):
        return inference(operands, index)

    def fwd(operands, index):
        outputs, residuals = forward(operands, index)
        return outputs, ({n: operands[n] for n in plans.saved}, index, residuals)

    # Operands the plans give no gradient (lightning's decay): zeros.
    constant = {n: (a.shape, a.dtype) for n, a in operands.items() if n not in dict(plans.grads)}

    def bwd(res, cotangents):
        saved, index, residuals = res
        grads = backward(saved, index, residuals, tuple(cotangents))
        grads.update({n: jnp.zeros(shape, dtype) for n, (shape, dtype) in constant.items()})
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index)
        return grads, zeros

    op.defvjp(fwd, bwd)
    outputs = op(operands, index)
    return outputs if len(outputs) > 1 else outputs[0]


def _all_major(tree):
    return jax.tree.map(lambda _: True, tree)


def _folded(infos: dict[str, TensorInfo], k: int, shared) -> dict[str, TensorInfo]:
    """``infos`` with each batch-major input ``[B, ...]`` as ``[k * B, ...]``."""

    def fold(t: TensorInfo) -> TensorInfo:
        shape = (k * t.shape[0], *t.shape[1:])
        return TensorInfo(shape, t.dtype, contiguous_strides(shape))

    return {n: t if n in shared else fold(t) for n, t in infos.items()}


def _without_head_sums(steps, outputs: dict[str, str]):
    """``steps`` less the per-head sums that write ``outputs`` (gradient name
    -> array), and those sums' sources by gradient name: the gradient of a
    shared input sums over the whole folded batch, and each element wants
    its own sum (:func:`_head_sum_per_element`)."""
    sources = {}
    for n, out in outputs.items():
        source = reductions.head_sum_source(steps, out)
        if source is None:
            raise NotImplementedError(f"vmap: no per-element sum for the gradient of {n} (no batch axis)")
        sources[n] = source
        steps = tuple(s for s in steps if s.output_names[0] not in (out, f"{out}_parts"))
    return steps, sources


def _head_sum_per_element(env, source, k: int):
    """One per-head sum per folded element, ``[k, F]``: the ``k`` elements'
    ``[R, F]`` rows of the source side by side as ``[R, k * F]``, summed by
    the same two launches as one element alone (same bits)."""
    src, rows, features, dtype = source
    x = side_by_side(env[src].reshape(rows, features), k, 1)
    steps = reductions.head_sum_plans(
        "x", rows // k, features, dtype, "sum", is_interpreted(reductions.head_sum_kernel), groups=k
    )
    return run_named(steps, {"x": x}, launch)["sum"].reshape(k, features)
