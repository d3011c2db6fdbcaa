"""twinkernels' flash attention where JAX model code calls an attention
function: :func:`dot_product_attention` takes the arguments of
``jax.nn.dot_product_attention``, :func:`attention_fn` those of flax's
``nnx.dot_product_attention`` / ``linen.dot_product_attention`` (the
``attention_fn`` of ``nnx.MultiHeadAttention`` and
``linen.MultiHeadDotProductAttention``).

    from flax import nnx
    from jax_api.integrations.flax import attention_fn
    layer = nnx.MultiHeadAttention(8, 64, attention_fn=attention_fn, decode=False, rngs=nnx.Rngs(0))

Both take ``[batch, length, heads, head_dim]`` arrays (our layout; key and
value may have fewer heads where the caller allows it) and hand masks to
the kernel in the cheapest form it has: ``is_causal`` as ``causal``,
``query_seq_lengths``/``key_value_seq_lengths`` as segment ids made on the
device, ``local_window_size`` as ``sliding_window``; a dense boolean
``mask`` (what flax's modules pass) becomes an additive bias, ``-inf``
where it is false.  A query left with no key gets output 0 and gradient 0
(jax.nn and flax average every value there, with gradient 0 through the
logits: a finite stand-in for ``-inf`` would give a gradient that their
output does not have).  Dropout at training time, ``return_residual`` and
``implementation`` other than None raise ``ValueError``.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_api.flash_attention import flash_attention
from jax_api.integrations.flax_inputs import bias_of, flat_mask, length_segments


def _flax():
    try:
        import flax
    except ImportError as e:  # optional dependency
        raise ImportError(
            "jax_api.integrations.flax needs flax: pip install 'twinkernels[flax]' (or flax>=0.12.8)"
        ) from e
    return flax


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale=None,
    is_causal=False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size=None,
    implementation=None,
    return_residual=False,
):
    """``jax.nn.dot_product_attention``'s signature and meaning: ``query
    [B, T, N, H]`` (or ``[T, N, H]``), ``key``/``value [B, S, K, H]`` with
    ``N % K == 0`` -> ``[B, T, N, H]``.  Padded query rows (past
    ``query_seq_lengths``) come out computed against the padded keys, where
    jax.nn averages all values: use neither."""
    if implementation is not None:
        raise ValueError(f"implementation must be None (twinkernels' kernel), got {implementation!r}")
    if return_residual:
        raise ValueError(
            "return_residual=True is not supported (use jax_api.flash_attention(return_lse=True))"
        )
    unbatched = jnp.ndim(query) == 3
    if unbatched:
        query, key, value = (x[None] for x in (query, key, value))
    B, Tq, HQ, _ = query.shape
    Tk = key.shape[1]
    options = {}
    if query_seq_lengths is not None or key_value_seq_lengths is not None:
        q_len = Tq if query_seq_lengths is None else query_seq_lengths
        kv_len = Tk if key_value_seq_lengths is None else key_value_seq_lengths
        options["q_segment_ids"] = length_segments(jnp.broadcast_to(q_len, (B,)), Tq)
        options["kv_segment_ids"] = length_segments(jnp.broadcast_to(kv_len, (B,)), Tk)
    b = bias_of(bias, mask, B, HQ, Tq, Tk)
    out = flash_attention(
        query, key, value, bias=None if b is None else b.astype(query.dtype),
        sliding_window=local_window_size, causal=bool(is_causal), softmax_scale=scale, **options,
    )  # fmt: skip
    return out[0] if unbatched else out


def attention_fn(
    query,
    key,
    value,
    bias=None,
    mask=None,
    broadcast_dropout=True,
    dropout_rng=None,
    dropout_rate=0.0,
    deterministic=False,
    dtype=None,
    precision=None,
    module=None,
    promote_dtype=None,
    is_causal=False,
):
    """flax's ``dot_product_attention`` signature: ``query [batch..., Tq,
    heads, D]``, ``key``/``value [batch..., Tk, heads, D]``, ``mask``
    boolean broadcastable to ``[batch..., heads, Tq, Tk]`` -> ``[batch...,
    Tq, heads, Dv]`` in ``dtype`` (default: the inputs' promoted dtype).
    ``precision`` is the kernel's own (float32 inputs: full float32
    products); ``module`` (attention-weight sowing) is not supported."""
    if dropout_rate > 0.0 and not deterministic:
        raise ValueError(
            f"twinkernels attention has no dropout; got dropout_rate={dropout_rate} with deterministic=False"
        )
    if module is not None:
        raise ValueError("twinkernels attention cannot sow attention weights (module / sow_weights)")
    dtype = dtype or jnp.result_type(query, key, value)
    query, key, value = (jnp.asarray(x, dtype) for x in (query, key, value))
    lead = query.shape[:-3]
    flat = [x.reshape((-1,) + x.shape[-3:]) for x in (query, key, value)]
    B = flat[0].shape[0]

    out = dot_product_attention(
        *flat,
        bias=None if bias is None else flat_mask(bias, lead, B),
        mask=None if mask is None else flat_mask(mask, lead, B),
        is_causal=is_causal,
    )
    return out.reshape(lead + out.shape[1:])


_flax()  # the ImportError that says what to install, at import
