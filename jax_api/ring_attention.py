"""``ring_attention`` for JAX: flash attention over a sequence sharded along
a ``shard_map`` axis (algorithm: core_triton.attention.ring).

Forward: the schedule's steps (``n``, fewer when a window needs no far
shard); at each, the next key/value shard is already on its way
(``lax.ppermute``, independent of the step's kernel, so XLA overlaps them)
while the kernel runs on the current one; partial results merge in float32
by log-sum-exp.  A step the mask may remove entirely, depending on the
device (the rank is traced), runs its kernels in a ``lax.cond``.  One
``custom_vjp`` covers the whole ring: the backward makes the same trip with
the key/value shards and their float32 dK/dV accumulators, which go home
after the walk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from core_triton.attention import ring as core
from core_triton.attention import softmax_parts
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_named, run_steps
from jax_api._launch import info, launch
from jax_api.flash_attention import cotangent, primal_values, sink_grad


def _merge(out, lse, out_b, lse_b):
    """Log-sum-exp merge in float32 (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.ring_merge_plan(*out.shape[:3], out.shape[3])
    return tuple(launch(plan, {"out": out, "lse": lse, "out_b": out_b, "lse_b": lse_b}))


def _add_sinks(out, lse, sink):
    """The sinks join the normaliser once (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.ring_sinks_plan(*out.shape[:3], out.shape[3], info(sink))
    return tuple(launch(plan, {"out": out, "lse": lse, "softmax_aux": sink}))


def ring_attention(
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
    zigzag: bool = False,
    axis_name=None,
    group=None,
    cu_seqlens: jax.Array | None = None,
):
    """``flash_attention`` over a sequence sharded across devices, called inside
    ``shard_map`` (with ``check_vma=False``) over ``axis_name`` (required)
    with the local shards: ``query [B, T_local, HQ, D]``, ``key/value [B,
    T_local, H, D(v)]``, segment ids and positions ``[B, T_local]``, ``bias
    [B|1, HQ|1, T_local, n*T_local]`` (global key order).  Same options and
    defaults as ``flash_attention``; explicit positions are global. ``zigzag``
    (default False): the shards are in the zig-zag layout
    (``zigzag_reorder``). ``cu_seqlens`` (packed input, batch 1): int32/int64
    ``[N+1]`` boundaries of sequences in the global token order (before any
    zig-zag reordering), the same array on every device, shared by queries
    and keys; masks apply per sequence, tokens outside every sequence get
    output 0; not with segment ids or positions. ``group`` is the PyTorch binding's and must be None
    here.  Returns the local output ``[B, T_local, HQ, Dv]`` (and ``lse [B,
    HQ, T_local]`` float32 with ``return_lse``).

    Reference: docs/api.md#ring_attention"""
    if axis_name is None:
        raise ValueError("axis_name must name the shard_map axis of the ring")
    if group is not None:
        raise ValueError("group is for the PyTorch binding; JAX takes axis_name")
    zigzag = check_bool(zigzag, "zigzag")
    n = lax.psum(1, axis_name)
    if not isinstance(n, int):
        n = int(n)
    given = {
        "q_segment_ids": q_segment_ids,
        "kv_segment_ids": kv_segment_ids,
        "q_positions": q_positions,
        "kv_positions": kv_positions,
    }
    index, launches = core.packed(info(query), n, info(cu_seqlens), {x: info(a) for x, a in given.items()})
    plans, return_lse, schedule = core.plans(
        info(query),
        info(key),
        info(value),
        n,
        bool(zigzag),
        index["q_segment_ids"],
        index["kv_segment_ids"],
        info(softmax_aux),
        info(bias),
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        index["q_positions"],
        index["kv_positions"],
        return_lse,
    )
    t_local = query.shape[1]

    def mine():
        """This device's global token indices (its layout's order)."""
        rank = lax.axis_index(axis_name)
        order = core.zigzag_order(n, n * t_local) if zigzag else np.arange(n * t_local)
        return lax.dynamic_slice_in_dim(jnp.asarray(order, jnp.int32), rank * t_local, t_local)

    if launches:
        # Packed input: the global segment ids, then this device's tokens.
        cu = jnp.asarray(cu_seqlens)
        made = run_named(launches, {"cu_q": cu, "cu_k": cu}, launch)
        local = mine()
        q_segment_ids, kv_segment_ids = (
            jnp.take(made[x], local, axis=1) for x in ("q_segment_ids", "kv_segment_ids")
        )
    # Local index inputs; "moving" ones travel with the key/value shard.
    fixed, moving = {}, {}
    qs = q_segment_ids if q_segment_ids is not None else kv_segment_ids
    ks = kv_segment_ids if kv_segment_ids is not None else q_segment_ids
    if qs is not None:
        fixed["q_segment_ids"], moving["kv_segment_ids"] = jnp.asarray(qs), jnp.asarray(ks)
    if q_positions is not None or kv_positions is not None:
        local = mine()
        fixed["q_positions"] = jnp.asarray(q_positions) if q_positions is not None else local
        moving["kv_positions"] = jnp.asarray(kv_positions) if kv_positions is not None else local

    def shift(tree, places=1):
        """Each device's ``tree`` to the device ``places`` on (0: stays)."""
        if places % n == 0:
            return tree
        perm = [(i, (i + places) % n) for i in range(n)]
        return jax.tree.map(lambda a: lax.ppermute(a, axis_name, perm), tree)

    def unless_masked(masked, run, skip, *carry):
        """``run(*carry)``, or ``skip(*carry)`` where the mask removes the
        step: decided here when the schedule knows, else on the device
        (``lax.cond``: the removed step's kernels are not launched)."""
        if masked is None or masked is False:
            return run(*carry)
        if masked is True:
            return skip(*carry)
        return lax.cond(masked, skip, run, *carry)

    def offsets(offs):
        return jnp.stack([jnp.asarray(o, jnp.int32) for o in offs])

    def step_inputs(q, kv, step, b):
        inputs = {"q": q, "k": kv["k"], "v": kv["v"], "qoff": offsets(step.q_offsets)}
        inputs["koff"] = offsets(step.k_offsets)
        inputs.update(fixed)
        inputs.update({k: v for k, v in kv.items() if k not in ("k", "v")})
        if b is not None:
            inputs["bias"] = b
        return inputs

    def forward(q, k, v, sink, b, idx):
        fixed.update(idx[0])
        rank = lax.axis_index(axis_name)
        kv = {"k": k, "v": v, **idx[1]}
        out = lse = None
        for step in schedule.steps(rank):
            nxt = shift(kv) if not step.last else None  # in flight during this step's kernel

            def run(out, lse, kv=kv, step=step):
                out_b, lse_b = run_steps(plans.forward, step_inputs(q, kv, step, b), launch)
                return _merge(out, lse, out_b, lse_b)

            if out is None:  # the home step (first, never removed) starts the merge
                out, lse = run_steps(plans.forward, step_inputs(q, kv, step, b), launch)
            else:
                out, lse = unless_masked(step.masked_out, run, lambda *c: c, out, lse)
            kv = nxt
        if sink is not None:
            out, lse = _add_sinks(out, lse, sink)
        return out, lse

    @jax.custom_vjp
    def op(q, k, v, sink, b, idx):
        out, lse = forward(q, k, v, sink, b, idx)
        return out.astype(q.dtype), lse

    def op_fwd(*args):
        # symbolic_zeros: as in jax_api.flash_attention, the sinks' and the
        # bias's gradients are made only for inputs JAX differentiates.
        (q, k, v, sink, b, idx), needs = primal_values(args)
        out, lse = forward(q, k, v, sink, b, idx)
        flags = tuple(() if n else None for n in needs[3:5])
        return (out.astype(q.dtype), lse), (q, k, v, sink, b, idx, out, lse, flags)

    def op_bwd(res, cts):
        q, k, v, sink, b, idx, out, lse, (sink_flag, bias_flag) = res
        fixed.update(idx[0])
        dout = cotangent(cts[0], out).astype(q.dtype)
        rank = lax.axis_index(axis_name)
        (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
        if not isinstance(cts[1], SymbolicZero):
            delta = delta - cts[1].astype(jnp.float32)
        dkdv_plan, dq_plan = plans.grads(info(dout))
        kv = {"k": k, "v": v, **idx[1]}
        # The bias gradient, only when asked for: one bias-sized array that
        # each step fills at its shard's columns (every column once; XLA
        # updates it in place; a removed step's columns stay 0).
        db = None if bias_flag is None else jnp.zeros(b.shape, b.dtype)
        acc = dq = None
        for step in schedule.steps(rank):
            nxt = shift(kv) if not step.last else None

            def run(acc, dq, db, kv=kv, step=step):
                inputs = step_inputs(q, kv, step, b)
                inputs.update({"do": dout, "lse": lse, "delta": delta})
                dk_s, dv_s = run_steps(dkdv_plan, inputs, launch)
                (dq_s,) = run_steps(dq_plan, inputs, launch)
                if acc is not None:
                    dk_s, dv_s, dq_s = acc["dk"] + dk_s, acc["dv"] + dv_s, dq + dq_s
                if db is not None:
                    (db_s,) = launch(plans.dbias(info(dout)), inputs)
                    for a, g, c in step.bias_pieces:
                        piece = lax.slice_in_dim(db_s, a, a + c, axis=3)
                        db = lax.dynamic_update_slice_in_dim(db, piece, g, axis=3)
                return {"dk": dk_s, "dv": dv_s}, dq_s, db

            if acc is None:  # the home step: never removed
                acc, dq, db = run(None, None, db)
            else:
                acc, dq, db = unless_masked(step.masked_out, run, lambda *c: c, acc, dq, db)
            # The accumulators of src's shard leave with it for src + 1 ...;
            # after the walk they go home in one hop.
            acc = shift(acc, schedule.home_shift() if step.last else 1)
            kv = nxt
        dsink = sink_grad(sink, lse, delta) if sink_flag is not None else None
        zeros = jax.tree.map(lambda a: np.zeros(np.shape(a), jax.dtypes.float0), idx)
        return dq.astype(q.dtype), acc["dk"].astype(k.dtype), acc["dv"].astype(v.dtype), dsink, db, zeros

    op.defvjp(op_fwd, op_bwd, symbolic_zeros=True)
    idx = (dict(fixed), dict(moving))
    # Staged: JAX 0.10 refuses a symbolic_zeros custom_vjp in an eager
    # shard_map (jax_api.flash_attention.attention_call).
    out, lse = jax.jit(op)(query, key, value, softmax_aux, bias, idx)
    return (out, lse) if return_lse else out


def zigzag_reorder(x, ring_size: int, axis: int = 1):
    """Global sequence -> zig-zag layout along ``axis`` (default 1): shard ``r``
    of an equal split in ``n = ring_size`` holds chunks ``r`` and ``2n-1-r``
    of ``2n``.  ``x.shape[axis]`` must be a multiple of ``2 * ring_size``
    (``ValueError``).

    Reference: docs/api.md#zigzag_reorder"""
    order = np.asarray(core.zigzag_order(ring_size, x.shape[axis]))
    return jnp.take(x, order, axis=axis)


def zigzag_restore(x, ring_size: int, axis: int = 1):
    """Inverse of ``zigzag_reorder``: zig-zag layout along ``axis`` (default 1)
    back to the global order.

    Reference: docs/api.md#zigzag_restore"""
    order = np.asarray(core.zigzag_order(ring_size, x.shape[axis]))
    return jnp.take(x, np.argsort(order), axis=axis)


def ring_attention_mesh(
    mesh,
    axis_name: str,
    query,
    key,
    value,
    q_segment_ids=None,
    kv_segment_ids=None,
    softmax_aux=None,
    bias=None,
    zigzag: bool = False,
    cu_seqlens=None,
    **options,
):
    """JAX only: ``ring_attention`` on global arrays.  Shards them along
    ``seq_len`` over ``mesh``'s ``axis_name`` (reordering into the zig-zag
    layout first if ``zigzag``, and back after), runs ``ring_attention`` under
    ``shard_map`` and returns global results.  ``bias [B|1, HQ|1, T, T]`` is
    split along its query axis; ``cu_seqlens`` (global boundaries, packed
    input) is given whole to every device.  ``options``: ``sliding_window``, ``causal``,
    ``logits_soft_cap``, ``softmax_scale``, ``return_lse`` (positions follow
    from the layout).

    Reference: docs/api.md#ring_attention_mesh"""
    from jax.sharding import PartitionSpec as P

    n = mesh.shape[axis_name]
    ret = options.get("return_lse", False)

    def reorder(a, axis=1):
        return None if a is None or not zigzag else zigzag_reorder(a, n, axis)

    q, k, v = (reorder(a) if zigzag else a for a in (query, key, value))
    qs, ks = (reorder(a) if zigzag else a for a in (q_segment_ids, kv_segment_ids))
    b = reorder(bias, 2) if zigzag else bias
    seq = P(None, axis_name)
    specs = (
        seq,
        seq,
        seq,
        None if qs is None else seq,
        None if ks is None else seq,
        None if softmax_aux is None else P(),
    )
    specs = (*specs, None if b is None else P(None, None, axis_name), None if cu_seqlens is None else P())

    def body(q, k, v, qs, ks, sink, b, cu):
        return ring_attention(
            q, k, v, qs, ks, sink, b, zigzag=zigzag, axis_name=axis_name, cu_seqlens=cu, **options
        )

    out_specs = (seq, P(None, None, axis_name)) if ret else seq
    result = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(
        q, k, v, qs, ks, softmax_aux, b, cu_seqlens
    )
    if not zigzag:
        return result
    if ret:
        return zigzag_restore(result[0], n), zigzag_restore(result[1], n, 2)
    return zigzag_restore(result, n)
