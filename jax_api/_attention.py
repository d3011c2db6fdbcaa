"""What ``flash_attention`` and ``ring_attention`` share in JAX: the
``symbolic_zeros`` plumbing of their ``custom_vjp`` (which inputs JAX
differentiates) and the sinks' gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from core_triton.attention import softmax_parts
from jax_api._launch import info, launch


def float0_like(tree):
    """The cotangents of index inputs (never differentiated)."""
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


def sink_grad(sink, lse, delta):
    """The sinks' gradient (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.sink_grad_plan(info(sink), tuple(lse.shape))
    return launch(plan, {"softmax_aux": sink, "lse": lse, "delta": delta})[0]


def attention_vjp(forward, backward):
    """The ``custom_vjp`` ``op(q, k, v, sink, bias, idx) -> (out, lse)`` of
    an attention: ``forward(q, k, v, sink, bias, idx) -> (out, lse)`` (``out``
    in any float dtype: the op returns it in the queries', and keeps it as
    the backward's residual); ``backward(need_sink, need_bias, q, k, v,
    sink, bias, idx, out, lse, dout, dlse) -> (dq, dk, dv, dsink, dbias)``
    (``dout`` in the queries' dtype; ``dlse`` None when unused).

    ``symbolic_zeros=True`` tells the forward rule which inputs JAX
    differentiates: the sinks' and the bias's gradients are made only for
    those (``need_sink``, ``need_bias``), and an unused ``lse`` costs no
    subtraction.  Index inputs ``idx`` get float0 cotangents."""

    @jax.custom_vjp
    def op(q, k, v, sink, b, idx):
        out, lse = forward(q, k, v, sink, b, idx)
        return out.astype(q.dtype), lse

    def fwd(*args):
        (q, k, v, sink, b, idx), needs = primal_values(args)
        out, lse = forward(q, k, v, sink, b, idx)
        # Which gradients to make rides in the residuals' structure (() or
        # None), not as values: it must stay a trace-time constant.
        flags = tuple(() if n else None for n in needs[3:5])
        return (out.astype(q.dtype), lse), (q, k, v, sink, b, idx, out, lse, flags)

    def bwd(res, cts):
        q, k, v, sink, b, idx, out, lse, (sink_flag, bias_flag) = res
        dout = cotangent(cts[0], out).astype(q.dtype)
        dlse = None if isinstance(cts[1], SymbolicZero) else cts[1]
        needs = (sink_flag is not None, bias_flag is not None)
        grads = backward(*needs, q, k, v, sink, b, idx, out, lse, dout, dlse)
        return (*grads, float0_like(idx))

    op.defvjp(fwd, bwd, symbolic_zeros=True)
    return op
