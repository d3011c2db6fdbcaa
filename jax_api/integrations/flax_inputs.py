"""What JAX attention calls pass, turned into twinkernels' arguments
(jax_api.integrations.flax): masks and biases as one additive bias, sequence
lengths as segment ids, flax's leading batch dims flattened; all made on the
device."""

from __future__ import annotations

import jax.numpy as jnp

# Added to a masked-out logit (the kernel gives a row masked throughout
# output 0 and gradient 0).
MASKED = float("-inf")


def bias_of(bias, mask, B, HQ, Tq, Tk):
    """One additive bias ``[B|1, HQ|1, Tq, Tk]`` float32 from a bias and a
    boolean mask broadcastable to ``[B, HQ, Tq, Tk]``, or None."""
    total = None
    for part in (bias, None if mask is None else jnp.where(mask, 0.0, MASKED)):
        if part is None:
            continue
        part = jnp.asarray(part, jnp.float32)
        if part.ndim > 4:
            raise ValueError(f"bias and mask must have at most 4 dims [B, heads, Tq, Tk], got {part.shape}")
        part = part.reshape((1,) * (4 - part.ndim) + part.shape)
        total = part if total is None else total + part
    if total is None:
        return None
    b = B if total.shape[0] != 1 else 1
    h = HQ if total.shape[1] != 1 else 1
    return jnp.broadcast_to(total, (b, h, Tq, Tk))


def length_segments(lengths, T):
    """``[B, T]`` int32: 0 for the first ``lengths[b]`` tokens, 1 after (ids
    that never decrease: the kernels find each segment's keys by search)."""
    return (jnp.arange(T)[None, :] >= jnp.asarray(lengths).reshape(-1, 1)).astype(jnp.int32)


def flat_mask(m, lead, B):
    """A mask or bias broadcastable to ``[*lead, heads, Tq, Tk]`` as ``[B or
    1, heads|1, Tq, Tk]`` (``B``: the product of the leading dims ``lead``)."""
    m = jnp.asarray(m)
    m = m.reshape((1,) * max(0, len(lead) + 3 - m.ndim) + m.shape)
    if all(n == 1 for n in m.shape[:-3]):
        return m.reshape((1,) + m.shape[-3:])
    return jnp.broadcast_to(m, lead + m.shape[-3:]).reshape((B,) + m.shape[-3:])
