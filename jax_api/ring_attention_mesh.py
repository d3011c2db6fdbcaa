"""``ring_attention_mesh`` (JAX only): ``ring_attention`` on global arrays,
under ``shard_map``."""

from __future__ import annotations

import jax

from jax_api.ring_attention import ring_attention
from jax_api.zigzag import zigzag_reorder, zigzag_restore


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
