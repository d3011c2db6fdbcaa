"""``zigzag_reorder`` / ``zigzag_restore`` for JAX: the zig-zag layout of
``ring_attention``'s shards (core_triton.attention.ring.zigzag_order)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from core_triton.attention import ring as core


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
