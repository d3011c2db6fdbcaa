"""``flash_attention`` for JAX (semantics: core_triton.flash_attention).

One ``jax.custom_vjp`` over the forward launch; the backward runs the
preprocess, dK/dV and dQ launches.  Segment ids, positions and the piece
offsets are index inputs: they may be traced and get float0 cotangents.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from core_triton import flash_attention as core
from jax_api._launch import info, launch


def _float0_like(tree):
    return jax.tree.map(lambda a: np.zeros(np.shape(a), jax.dtypes.float0), tree)


def attention_call(plans, query, key, value, softmax_aux, bias, index, bias_axes=()):
    """Run ``plans`` (core_triton.flash_attention.AttentionPlans) as a
    differentiable op; returns ``(out, lse)``.  ``index``: the plans' index
    inputs (``qoff``, ``koff`` and segment ids / positions by name).  A
    cotangent on ``lse`` is honoured: it enters as ``delta - dlse``."""

    @jax.custom_vjp
    def op(q, k, v, sink, b, idx):
        inputs = {"q": q, "k": k, "v": v, **idx}
        if sink is not None:
            inputs["softmax_aux"] = sink
        if b is not None:
            inputs["bias"] = b
        out, lse = launch(plans.forward, inputs)
        return out, lse

    def fwd(q, k, v, sink, b, idx):
        out, lse = op(q, k, v, sink, b, idx)
        return (out, lse), (q, k, v, sink, b, idx, out, lse)

    def bwd(res, cts):
        q, k, v, sink, b, idx, out, lse = res
        dout, dlse = cts
        dout = dout.astype(out.dtype)
        (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
        delta = delta - dlse.astype(jnp.float32)
        dkdv_plan, dq_plan = plans.grads(info(dout))
        inputs = {"q": q, "k": k, "v": v, "do": dout, "lse": lse, "delta": delta, **idx}
        if b is not None:
            inputs["bias"] = b
        dk, dv, dbias = launch(dkdv_plan, inputs)
        (dq,) = launch(dq_plan, inputs)
        dsink = None
        if sink is not None:
            dsink = sink_grad(sink, lse, delta)
        db = None
        if b is not None:
            db = jnp.sum(dbias, axis=bias_axes, keepdims=True) if bias_axes else dbias
            db = db.astype(b.dtype)
        return dq, dk, dv, dsink, db, _float0_like(idx)

    op.defvjp(fwd, bwd)
    return op(query, key, value, softmax_aux, bias, index)


def sink_grad(sink, lse, delta):
    """``dsink[h, s] = -sum_{b,i} exp(sink[h, s] - lse[b, h, i]) delta[b, h, i]``."""
    s2 = sink.astype(jnp.float32).reshape(sink.shape[0], -1)
    p = jnp.exp(s2[None, :, :, None] - lse[:, :, None, :])
    return (-jnp.sum(p * delta[:, :, None, :], axis=(0, 3))).reshape(sink.shape).astype(sink.dtype)


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
    Tq]`` float32 with ``return_lse``).  See the spec for every option."""
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
    axes = core.bias_reduce_axes(info(bias)) if bias is not None else ()
    out, lse = attention_call(plans, query, key, value, softmax_aux, bias, idx, axes)
    return (out, lse) if return_lse else out
