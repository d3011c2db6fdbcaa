"""``ring_attention`` for JAX: flash attention over a sequence sharded along
a ``shard_map`` axis (algorithm: core_triton.attention.ring; the walk:
core_triton.attention.ring_walk).

Forward: the schedule's steps (``n``, fewer when a window needs no far
shard); at each, the next key/value shard is already on its way
(``lax.ppermute``, independent of the step's kernel, so XLA overlaps them;
jax_api._ring) while the kernel runs on the current one; partial results
merge in float32 by log-sum-exp.  A step the mask may remove entirely,
depending on the device (the rank is traced), runs its kernels in a
``lax.cond``.  One ``custom_vjp`` covers the whole ring: the backward makes
the same trip with the key/value shards and their float32 dK/dV
accumulators, which go home after the walk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from core_triton.attention import ring as core
from core_triton.attention import ring_walk
from core_triton.attention.flash_options import AttentionCall
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_named
from jax_api._attention import attention_vjp, sink_grad
from jax_api._launch import info, launch
from jax_api._ring import Ring


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
    # The ring's launches go through this module's launch (tests watch it).
    ring = Ring(axis_name, n if isinstance(n, int) else int(n), lambda plan, inputs: launch(plan, inputs))
    given = {"q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids}
    given.update(q_positions=q_positions, kv_positions=kv_positions)
    call = AttentionCall.of(locals(), info)  # the call's arguments by name
    plans, return_lse, schedule, launches = core.call_plans(call, ring.n, bool(zigzag))
    mine = lambda: ring.mine(query.shape[1], zigzag)  # noqa: E731
    if launches:
        # Packed input: the global segment ids, then this device's tokens.
        cu = jnp.asarray(cu_seqlens)
        made = run_named(launches, {"cu_q": cu, "cu_k": cu}, launch)
        local = mine()
        given.update((x, jnp.take(made[x], local, axis=1)) for x in ("q_segment_ids", "kv_segment_ids"))
    arrays = (None if a is None else jnp.asarray(a) for a in given.values())
    # Local index inputs; "moving" ones travel with the key/value shard.
    idx = ring_walk.split_index(*arrays, mine)

    def forward(q, k, v, sink, b, idx):
        return ring_walk.forward(ring, plans, schedule, q, {"k": k, "v": v, **idx[1]}, idx[0], sink, b)

    def backward(need_sink, need_bias, q, k, v, sink, b, idx, out, lse, dout, dlse):
        kv = {"k": k, "v": v, **idx[1]}
        dq, dk, dv, db, delta = ring_walk.backward(
            ring, plans, schedule, q, kv, idx[0], b, out, lse, dout, dlse, need_bias
        )
        return dq, dk, dv, sink_grad(sink, lse, delta) if need_sink else None, db

    # One custom_vjp over the whole ring; the float32 output is the residual.
    op = attention_vjp(forward, backward)
    # Staged: JAX 0.10 refuses a symbolic_zeros custom_vjp in an eager
    # shard_map (jax_api._flash.attention_call).
    out, lse = jax.jit(op)(query, key, value, softmax_aux, bias, idx)
    return (out, lse) if return_lse else out
