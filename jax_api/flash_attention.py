"""``flash_attention`` for JAX (semantics: core_triton.attention.flash).

One ``jax.custom_vjp`` over the forward launch; the backward runs the
preprocess, dK/dV and dQ launches.  Segment ids, positions and the piece
offsets are index inputs: they may be traced and get float0 cotangents.

A bias that needs no gradient.  Both bindings take the same arguments, so
there is no flag for it; instead the ``custom_vjp`` is built with
``symbolic_zeros=True``, which tells the forward rule which inputs JAX is
differentiating (``CustomVJPPrimal.perturbed``).  A bias that is not an
argument being differentiated (not in ``argnums``, closed over, a constant,
or passed through ``jax.lax.stop_gradient``) is not perturbed: the backward
then launches no bias-gradient kernel and allocates no buffer for it, and
JAX's cotangent for it is zero.  The same mechanism skips the sinks'
gradient and the ``lse`` cotangent when they are unused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from core_triton.attention import flash as core
from core_triton.attention import softmax_parts
from jax_api._launch import info, launch


def _float0_like(tree):
    return jax.tree.map(lambda a: np.zeros(np.shape(a), jax.dtypes.float0), tree)


def primal_values(args):
    """``(values, needs_grad)`` of a ``symbolic_zeros=True`` forward rule's
    arguments: the arrays, and per argument whether JAX differentiates it
    (None for an absent optional argument)."""
    values = jax.tree.map(lambda p: p.value, args)
    needs = tuple(
        None if a is None else any(p.perturbed for p in jax.tree.leaves(a, is_leaf=_is_primal)) for a in args
    )
    return values, needs


def _is_primal(x):
    return hasattr(x, "perturbed")


def cotangent(ct, like):
    """An output cotangent, with a symbolic zero made explicit."""
    return jnp.zeros_like(like) if isinstance(ct, SymbolicZero) else ct


_JITTED: dict[int, tuple] = {}


def attention_call(plans, query, key, value, softmax_aux, bias, index):
    """Run ``plans`` (core_triton.attention.flash.AttentionPlans) as a
    differentiable op; returns ``(out, lse)``.  ``index``: the plans' index
    inputs (``qoff``, ``koff`` and segment ids / positions by name).  A
    cotangent on ``lse`` is honoured: it enters as ``delta - dlse``.  The
    sinks' and the bias's gradients are computed only for the inputs JAX
    differentiates (module docstring).

    The op runs under ``jax.jit``, one per plans object (plans are cached,
    so eager calls compile once): JAX 0.10 refuses a ``symbolic_zeros``
    custom_vjp inside an eager ``shard_map`` (NotImplementedError) but
    takes it staged."""
    hit = _JITTED.get(id(plans))
    if hit is None or hit[0] is not plans:
        if len(_JITTED) >= 256:
            _JITTED.clear()
        hit = _JITTED[id(plans)] = (plans, jax.jit(_op(plans)))
    return hit[1](query, key, value, softmax_aux, bias, index)


def _op(plans):
    """The ``custom_vjp`` of ``plans``: ``op(q, k, v, sink, bias, idx) ->
    (out, lse)``."""

    def run(q, k, v, sink, b, idx):
        inputs = {"q": q, "k": k, "v": v, **idx}
        if sink is not None:
            inputs["softmax_aux"] = sink
        if b is not None:
            inputs["bias"] = b
        out, lse = launch(plans.forward, inputs)
        return out, lse

    op = jax.custom_vjp(run)

    def fwd(*args):
        (q, k, v, sink, b, idx), needs = primal_values(args)
        out, lse = run(q, k, v, sink, b, idx)
        # Which gradients to make rides in the residuals' structure (() or
        # None), not as values: it must stay a trace-time constant.
        flags = tuple(() if n else None for n in needs[3:5])
        return (out, lse), (q, k, v, sink, b, idx, out, lse, flags)

    def bwd(res, cts):
        q, k, v, sink, b, idx, out, lse, (sink_flag, bias_flag) = res
        dout = cotangent(cts[0], out).astype(out.dtype)
        (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
        if not isinstance(cts[1], SymbolicZero):
            delta = delta - cts[1].astype(jnp.float32)
        dkdv_plan, dq_plan = plans.grads(info(dout))
        inputs = {"q": q, "k": k, "v": v, "do": dout, "lse": lse, "delta": delta, **idx}
        if b is not None:
            inputs["bias"] = b
        dk, dv = launch(dkdv_plan, inputs)
        (dq,) = launch(dq_plan, inputs)
        dsink = sink_grad(sink, lse, delta) if sink_flag is not None else None
        # Bias shape and dtype, reduced over broadcast dims inside the launch.
        db = launch(plans.dbias(info(dout)), inputs)[0] if bias_flag is not None else None
        return dq, dk, dv, dsink, db, _float0_like(idx)

    op.defvjp(fwd, bwd, symbolic_zeros=True)
    return op


def sink_grad(sink, lse, delta):
    """The sinks' gradient (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.sink_grad_plan(info(sink), tuple(lse.shape))
    return launch(plan, {"softmax_aux": sink, "lse": lse, "delta": delta})[0]


def index_inputs(plans, q_segment_ids, kv_segment_ids, q_positions, kv_positions, lengths):
    """The index inputs of ``plans``: offsets, segment ids, positions, and
    ``arange`` for a missing position array (``lengths`` = (Tq, Tk))."""
    idx = {"qoff": jnp.asarray(plans.qoff, jnp.int32), "koff": jnp.asarray(plans.koff, jnp.int32)}
    for name, value in (
        ("q_segment_ids", q_segment_ids),
        ("kv_segment_ids", kv_segment_ids),
        ("q_positions", q_positions),
        ("kv_positions", kv_positions),
    ):
        if value is not None:
            idx[name] = jnp.asarray(value)
    for name, n in core.missing_positions(*lengths, q_positions, kv_positions).items():
        idx[name] = jnp.arange(n, dtype=jnp.int32)
    return idx


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    softmax_aux: jax.Array | None = None,
    bias: jax.Array | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    causal: bool = False,
    logits_soft_cap: float | None = None,
    softmax_scale: float | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    return_lse: bool = False,
):
    """Softmax attention.  query ``[B, Tq, HQ, D]``, key ``[B, Tk, H, D]``,
    value ``[B, Tk, H, Dv]`` -> output ``[B, Tq, HQ, Dv]`` (and ``lse [B, HQ,
    Tq]`` float32 with ``return_lse``).  See the spec for every option.
    ``bias [B|1, HQ|1, Tq, Tk]``: its gradient has its shape and dtype, and
    is computed only when JAX differentiates the bias; to use a bias as a
    constant, close over it, leave it out of ``argnums`` or pass
    ``jax.lax.stop_gradient(bias)`` (module docstring)."""
    plans, return_lse = core.plans(
        info(query),
        info(key),
        info(value),
        info(q_segment_ids),
        info(kv_segment_ids),
        info(softmax_aux),
        info(bias),
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        info(q_positions),
        info(kv_positions),
        return_lse,
    )
    idx = index_inputs(
        plans, q_segment_ids, kv_segment_ids, q_positions, kv_positions, (query.shape[1], key.shape[1])
    )
    out, lse = attention_call(plans, query, key, value, softmax_aux, bias, idx)
    return (out, lse) if return_lse else out
