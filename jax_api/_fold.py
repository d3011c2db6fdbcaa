"""``vmap`` by folding: a vmapped axis joins the batch axis, one launch.

The kernels take a batch axis already, so ``vmap`` over ``n`` calls of a
batch of ``B`` can be one call on a batch of ``n * B``: move the vmapped
axis to the front, reshape ``[n, B, ...] -> [n * B, ...]`` (a row-major
reshape, free), plan for the larger batch, launch once, and reshape each
result back.  :func:`foldable` gives a function that rule.

Where it sits.  An op is a ``jax.custom_vjp`` whose primal, forward and
backward functions call foldable functions: ``vmap`` of a ``custom_vjp``
batches those functions, so plain ``vmap``, ``grad`` of ``vmap`` and
``vmap`` of ``grad`` (per-example gradients) all fold.  A ``custom_vmap``
around the ``custom_vjp`` itself would not do: it has no reverse-mode rule,
and ``vmap(grad(f))`` fails to linearize.

Layout.  Each array argument is batch-major (its leading axis is the
batch, or a multiple of it ordered batch first, like the chunk states
``[B * NT, ...]``) or shared (no batch axis: ``g_gamma [H]``, sinks,
offsets, ``[T]`` positions).  A vmapped batch-major argument is folded;
an un-vmapped one is broadcast first (each element reads it); a shared
one is passed as it is.  A *vmapped* shared argument cannot fold: then the
rule falls back to ``vmap`` of the plain function, whose launches run one
per element (jax_api._launch: ``sequential_vmap``, or a sequential
``pure_callback``).

Fold factor.  ``make(k)`` is the function for inputs already folded ``k``
times (``k = 1``: the op as called).  Its outputs are batch-major (they
unfold by reshape), or, for the gradient of a shared argument, a value per
folded element: ``[k, *shape]`` when ``k > 1``, which unfolds the same way.
Nested ``vmap`` folds again: the rule calls the foldable ``make(k * n)``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

# ``layout(elements, in_batched)``: for each leaf of the arguments, True
# when it is batch-major.  ``elements``: the arguments as one vmapped
# element sees them (ShapeDtypeStructs, None where absent).
Layout = Callable[..., object]


def _has_tracer(args) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))


def foldable(make: Callable[[int], Callable], layout: Layout, k: int = 1) -> Callable:
    """``make(k)`` with the folding batch rule (module docstring)."""
    body = make(k)
    fn = jax.custom_batching.custom_vmap(body)

    @fn.def_vmap
    def rule(n, in_batched, *args):
        in_batched = tuple(in_batched)
        elements = jax.tree.map(
            lambda x, b: jax.ShapeDtypeStruct(x.shape[1:] if b else x.shape, x.dtype), args, in_batched
        )
        major = layout(elements, in_batched)
        pairs = zip(jax.tree.leaves(in_batched), jax.tree.leaves(major), strict=True)
        if n == 0 or any(b and not m for b, m in pairs):
            in_axes = jax.tree.map(lambda b: 0 if b else None, in_batched)
            outs = jax.vmap(body, in_axes=tuple(in_axes))(*args)
            return outs, jax.tree.map(lambda _: True, outs)
        folded = jax.tree.map(lambda x, b, m: _fold(x, b, m, n), args, in_batched, major)
        shapes = jax.eval_shape(body, *elements)
        outs = foldable(make, layout, k * n)(*folded)
        outs = jax.tree.map(lambda o, s: o.reshape(n, *s.shape), outs, shapes)
        return outs, jax.tree.map(lambda _: True, outs)

    def call(*args):
        # Only a traced argument can be vmapped: concrete calls skip the
        # custom_vmap (which would trace the body on every eager call).
        return fn(*args) if _has_tracer(args) else body(*args)

    return call


def _fold(x, batched: bool, batch_major: bool, n: int):
    """``x`` as the folded call reads it: ``[n, B, ...] -> [n * B, ...]``
    (broadcast first when not vmapped), or as it is when shared."""
    if not batch_major:
        return x
    if not batched:
        x = jnp.broadcast_to(x, (n, *x.shape))
    return x.reshape(n * x.shape[1], *x.shape[2:])


def unfold(x, k: int):
    """``[k * B, ...] -> [k, B, ...]``."""
    return x.reshape(k, x.shape[0] // k, *x.shape[1:])


def side_by_side(x, k: int, axis: int):
    """``[k * B, ...]`` with its ``k`` groups merged into the group's axis
    ``axis`` as the outer factor: ``[k * R, F] -> [R, k * F]`` (``axis=1``)
    puts the groups' matrices side by side, as a per-head sum wants them;
    ``[k * B, HQ, T] -> [B, k * HQ, T]``: the groups as more heads."""
    x = unfold(x, k)
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(*x.shape[:axis], k * x.shape[axis + 1], *x.shape[axis + 2 :])
