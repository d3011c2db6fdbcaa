"""The differentiable op of JAX's ``flash_attention`` (jax_api.flash_attention
plans the call and makes its index inputs): flash attention's runner, beside
jax_api._op, the runner of the ops core_triton describes as OpPlans, which
this op does not use: its backward depends on which inputs JAX
differentiates and on the ``lse`` cotangent, which OpPlans does not express.

One ``jax.custom_vjp`` over the forward launch; the backward runs the dQ
launch (which also makes delta) and the dK/dV launch.  Segment ids,
positions and the piece offsets are index inputs: they may be traced and
get float0 cotangents.

A bias that needs no gradient.  Both bindings take the same arguments, so
there is no flag for it; instead the ``custom_vjp`` is built with
``symbolic_zeros=True``, which tells the forward rule which inputs JAX is
differentiating (``CustomVJPPrimal.perturbed``; jax_api._attention).  A
bias that is not an argument being differentiated (not in ``argnums``,
closed over, a constant, or passed through ``jax.lax.stop_gradient``) is
not perturbed: the backward then launches no bias-gradient kernel and
allocates no buffer for it, and JAX's cotangent for it is zero.  The same
mechanism skips the sinks' gradient and the ``lse`` cotangent when they
are unused.

``vmap``: the forward and the backward inside the ``custom_vjp`` fold a
vmapped axis into the batch axis and launch once (jax_api._fold; which
arguments fold: :func:`_layout`).  The sinks' gradient is then made per
element by one launch that sees the elements as more heads; a shared bias
of batch 1 gets its gradient from one launch per element.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from core_triton.attention import flash as core
from core_triton.attention import flash_call
from core_triton.common.launch import run_steps
from jax_api._attention import attention_vjp, sink_grad
from jax_api._fold import foldable, side_by_side, unfold
from jax_api._launch import info, launch

_JITTED: dict[tuple, object] = {}


def attention_call(options, query, key, value, softmax_aux, bias, index):
    """The attention of ``options`` (``(sliding_window, causal,
    logits_soft_cap, softmax_scale)``, checked and hashable) as a
    differentiable op; returns ``(out, lse)``.  ``index``: the plans' index
    inputs (``qoff``, ``koff`` and segment ids / positions by name).  A
    cotangent on ``lse`` is honoured: it enters as ``delta - dlse``.  The
    sinks' and the bias's gradients are computed only for the inputs JAX
    differentiates (module docstring).  Under ``vmap`` the op folds the
    vmapped axis into the batch axis (:func:`_layout`).

    The op runs under ``jax.jit``, one per options (its plans come from
    the shapes it is traced with): JAX 0.10 refuses a ``symbolic_zeros``
    custom_vjp inside an eager ``shard_map`` (NotImplementedError) but
    takes it staged."""
    op = _JITTED.get(options)
    if op is None:
        if len(_JITTED) >= 256:
            _JITTED.clear()
        op = _JITTED[options] = jax.jit(_op(options))
    return op(query, key, value, softmax_aux, bias, index)


def call_options(sliding_window, causal, logits_soft_cap, softmax_scale) -> tuple:
    """The options of a call (checked by core.plans already) as a key."""
    window = core.window_pair(sliding_window)
    window = None if window is None else tuple(window)
    cap, scale = (None if x is None else float(x) for x in (logits_soft_cap, softmax_scale))
    return window, bool(causal), cap, scale


def _plans_for(options, q, k, v, sink, b, idx):
    """The plans for these arrays: the ones of the call, or of a folded
    batch.  Missing positions are in ``idx`` already (as ``[T]`` aranges,
    which is what core_triton plans them as)."""
    window, causal, cap, scale = options
    plans, _ = core.plans(
        info(q),
        info(k),
        info(v),
        info(idx.get("q_segment_ids")),
        info(idx.get("kv_segment_ids")),
        info(sink),
        info(b),
        window,
        causal,
        cap,
        scale,
        info(idx.get("q_positions")),
        info(idx.get("kv_positions")),
        q_key_range=info(idx.get("q_key_range")),
        kv_query_range=info(idx.get("kv_query_range")),
    )
    return plans


def _layout(elements, in_batched):
    """Which arguments of the forward ``(q, k, v, sink, bias, idx)`` and of
    the backward (those, then ``out, lse, dout, dlse``) are batch-major.
    Shared: the sinks, ``qoff``/``koff``, ``[T]`` positions, and a bias of
    batch 1 that is not vmapped (read with batch stride 0, no copy); a bias
    of batch ``B`` is batch-major (a vmapped bias of batch 1 < ``B`` then
    cannot fold)."""
    q, _, _, sink, b, idx = elements[:6]
    bias = None
    if b is not None:
        bias = b.shape[0] == q.shape[0] and bool(in_batched[4] or b.shape[0] > 1)
    index = {n: a.ndim == 2 for n, a in idx.items()}
    rest = tuple(None if a is None else True for a in elements[6:])
    return (True, True, True, None if sink is None else False, bias, index, *rest)


def _forward(options, q, k, v, sink, b, idx):
    inputs = {"q": q, "k": k, "v": v, **idx}
    if sink is not None:
        inputs["softmax_aux"] = sink
    if b is not None:
        inputs["bias"] = b
    out, lse = run_steps(_plans_for(options, q, k, v, sink, b, idx).forward, inputs, launch)
    return out, lse


def _backward(options, need_sink, need_bias, groups, q, k, v, sink, b, idx, out, lse, dout, dlse):
    """``(dq, dk, dv, dsink, dbias)`` for inputs folded ``groups`` times:
    the sinks' gradient, and a shared bias's, per folded element then
    (``[groups, *shape]``; jax_api._fold)."""
    plans = _plans_for(options, q, k, v, sink, b, idx)
    shared_bias = need_bias and groups > 1 and b.shape[0] != q.shape[0]
    steps = plans.grads(info(dout), info(out), dlse is not None)
    steps = (*steps, plans.dbias(info(dout)) if need_bias and not shared_bias else None)
    inputs = {"q": q, "k": k, "v": v, **idx}
    if b is not None:
        inputs["bias"] = b
    cast = lambda x, dtype: x.astype(dtype)  # noqa: E731
    dq, dk, dv, db, delta = flash_call.gradients(launch, cast, steps, inputs, out, lse, dout, dlse)
    dsink = _sink_grad_per_element(sink, lse, delta, groups) if need_sink else None
    if shared_bias:
        db = _shared_dbias(options, groups, q, k, v, sink, b, idx, dout, lse, delta)
    return dq, dk, dv, dsink, db


def _op(options):
    """The ``custom_vjp`` of ``options``: ``op(q, k, v, sink, bias, idx) ->
    (out, lse)``."""
    run = foldable(lambda groups: functools.partial(_forward, options), _layout)

    def backward(need_sink, need_bias, *arrays):
        grads = foldable(
            lambda groups: functools.partial(_backward, options, need_sink, need_bias, groups), _layout
        )
        return grads(*arrays)

    return attention_vjp(run, backward)


def _sink_grad_per_element(sink, lse, delta, groups):
    """The sinks' gradient of each of ``groups`` folded elements, ``[groups,
    *sink.shape]`` (the sinks' shape for ``groups == 1``): the elements as
    more heads (``lse [groups * B, HQ, T] -> [B, groups * HQ, T]``, the
    sinks repeated), one launch, each head summed as one element alone
    sums it (same bits)."""
    if groups == 1:
        return sink_grad(sink, lse, delta)
    heads = jnp.broadcast_to(sink, (groups, *sink.shape)).reshape(groups * sink.shape[0], *sink.shape[1:])
    d = sink_grad(heads, side_by_side(lse, groups, 1), side_by_side(delta, groups, 1))
    return d.reshape(groups, *sink.shape)


def _shared_dbias(options, groups, q, k, v, sink, b, idx, dout, lse, delta):
    """The gradient of a shared bias (batch 1, not vmapped) per folded
    element, ``[groups, *b.shape]``.  The bias-gradient kernel sums over the
    whole batch it is given and reads a bias of batch 1 or ``B`` only, so
    each element gets its own launch (``vmap`` of the unfolded launch)."""
    major = {n: a for n, a in idx.items() if a.ndim == 2}
    shared = {n: a for n, a in idx.items() if a.ndim != 2}

    def one(q, k, v, dout, lse, delta, major):
        plans = _plans_for(options, q, k, v, sink, b, {**shared, **major})
        inputs = {"q": q, "k": k, "v": v, "do": dout, "lse": lse, "delta": delta, "bias": b}
        inputs.update(shared, **major)
        return launch(plans.dbias(info(dout)), inputs)[0]

    parts = (q, k, v, dout, lse, delta, major)
    return jax.vmap(one)(*jax.tree.map(lambda x: unfold(x, groups), parts))
