"""Packed-sequence utilities on JAX arrays.

``cu_seqlens`` is int32 ``[N+1]``: 0, then the running total of the sequence
lengths.  Functions whose output size follows from shapes alone (lens,
cu_seqlens from a mask, chunk offsets) work under ``jax.jit`` with traced
inputs; those whose size is a value (ids and indices of every token or
chunk) need concrete ``cu_seqlens``.  Id-valued outputs are int32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from core_triton.common import checks
from core_triton.common.utils import cdiv as _cdiv
from jax_api._launch import info


def check_cu_seqlens(cu_seqlens: jax.Array, seq_len: int) -> None:
    """Raise ``ValueError`` unless ``cu_seqlens`` (int32/int64 ``[N+1]``) starts
    at 0, never decreases and ends at ``seq_len`` (the packed inputs' length);
    ``TypeError`` for another type or dtype, or a traced ``cu_seqlens``.

    The ops never read ``cu_seqlens`` values on the host (it may be traced,
    and a copy would wait for the device): they clamp out-of-contract values,
    stay inside their arrays, and give 0 to tokens of no sequence.  Call this,
    once outside ``jax.jit``, where you want the error instead. It copies
    ``cu_seqlens`` to the host.

    Reference: docs/api.md#check_cu_seqlens"""
    _check_cu(cu_seqlens)
    if isinstance(cu_seqlens, jax.core.Tracer):
        raise TypeError("check_cu_seqlens needs concrete cu_seqlens (call it outside jax.jit)")
    checks.check_cu_seqlens_values(np.asarray(cu_seqlens), int(seq_len))


def cdiv(a, b):
    """Ceiling division ``-(-a // b)`` of ints or integer arrays.

    Reference: docs/api.md#cdiv"""
    return _cdiv(a, b)


def _check_cu(cu_seqlens):
    checks.check_cu_seqlens(info(cu_seqlens, "cu_seqlens"), batch=1)
    return jnp.asarray(cu_seqlens)


def prepare_lens(cu_seqlens: jax.Array) -> jax.Array:
    """``[N]`` sequence lengths of ``cu_seqlens`` (int32/int64 ``[N+1]``), in its
    dtype.  Works under ``jax.jit``.

    Reference: docs/api.md#prepare_lens"""
    cu_seqlens = _check_cu(cu_seqlens)
    return cu_seqlens[1:] - cu_seqlens[:-1]


def prepare_lens_from_mask(mask: jax.Array) -> jax.Array:
    """``[B]`` int32: the number of true entries of each row of a ``[B, T]``
    mask.  Works under ``jax.jit``.

    Reference: docs/api.md#prepare_lens_from_mask"""
    if not isinstance(mask, (jax.Array, np.ndarray)):
        raise TypeError(f"mask must be a jax.Array (or a numpy array), got {type(mask).__name__}")
    if mask.ndim != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    return jnp.sum(mask != 0, axis=-1, dtype=jnp.int32)


def prepare_cu_seqlens_from_mask(mask: jax.Array, out_dtype=jnp.int32) -> jax.Array:
    """``[B+1]`` cumulative lengths ``[0, cumsum(lens)]`` of the rows of a ``[B,
    T]`` mask, in ``out_dtype`` (default int32).  Works under ``jax.jit``.

    Reference: docs/api.md#prepare_cu_seqlens_from_mask"""
    lens = prepare_lens_from_mask(mask)
    return jnp.pad(jnp.cumsum(lens), (1, 0)).astype(out_dtype)


def prepare_chunk_offsets(cu_seqlens: jax.Array, chunk_size: int) -> jax.Array:
    """``[N+1]`` int32 cumulative chunk counts of ``cu_seqlens`` (int32/int64
    ``[N+1]``) for chunks of ``chunk_size`` tokens (a positive power of two).
    Works under ``jax.jit``.

    Reference: docs/api.md#prepare_chunk_offsets"""
    chunk_size = checks.check_power_of_two(chunk_size, "chunk_size")
    n_chunks = cdiv(prepare_lens(cu_seqlens), chunk_size)
    return jnp.pad(jnp.cumsum(n_chunks), (1, 0)).astype(jnp.int32)


def _ids_over(offsets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For every slot ``0..offsets[-1]-1``: the segment that owns it and its
    index inside that segment (segments given by cumulative ``offsets``)."""
    try:
        total = int(offsets[-1])
    except jax.errors.ConcretizationTypeError:
        raise ValueError(
            "the output size of this function is a value of cu_seqlens; call it "
            "with concrete cu_seqlens (outside jax.jit, or as a static argument)"
        ) from None
    slots = jnp.arange(total, dtype=offsets.dtype)
    # side='right' skips empty segments: their end equals the next one's start.
    seg = jnp.searchsorted(offsets[1:], slots, side="right")
    return seg.astype(jnp.int32), (slots - offsets[seg]).astype(jnp.int32)


def prepare_sequence_ids(cu_seqlens: jax.Array) -> jax.Array:
    """``[T]`` int32 sequence id of every token of ``cu_seqlens`` (int32/int64
    ``[N+1]``, ``T = cu_seqlens[-1]``).  Needs concrete ``cu_seqlens`` (its
    output size is one of its values).

    Reference: docs/api.md#prepare_sequence_ids"""
    return _ids_over(_check_cu(cu_seqlens))[0]


def prepare_position_ids(cu_seqlens: jax.Array) -> jax.Array:
    """``[T]`` int32 position of every token inside its sequence, for
    ``cu_seqlens`` (int32/int64 ``[N+1]``, ``T = cu_seqlens[-1]``).  Needs
    concrete ``cu_seqlens`` (its output size is one of its values).

    Reference: docs/api.md#prepare_position_ids"""
    return _ids_over(_check_cu(cu_seqlens))[1]


def prepare_token_indices(cu_seqlens: jax.Array) -> jax.Array:
    """``[T, 2]`` int32 (sequence id, position) of every token, for
    ``cu_seqlens`` (int32/int64 ``[N+1]``).  Needs concrete ``cu_seqlens``
    (its output size is one of its values).

    Reference: docs/api.md#prepare_token_indices"""
    return jnp.stack(_ids_over(_check_cu(cu_seqlens)), axis=1)


def prepare_chunk_indices(cu_seqlens: jax.Array, chunk_size: int) -> jax.Array:
    """``[total_chunks, 2]`` int32 (sequence id, chunk index in the sequence) of
    every chunk of ``chunk_size`` tokens (a positive power of two), for
    ``cu_seqlens`` (int32/int64 ``[N+1]``).  Needs concrete ``cu_seqlens``
    (its output size is one of its values).

    Reference: docs/api.md#prepare_chunk_indices"""
    return jnp.stack(_ids_over(prepare_chunk_offsets(cu_seqlens, chunk_size)), axis=1)


def identity_dtype_convert(dtype):
    """Identity whose backward casts the cotangent to ``dtype`` (anything
    ``jnp.dtype`` accepts).

    Reference: docs/api.md#identity_dtype_convert"""
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a JAX dtype, got {dtype!r}") from None

    @jax.custom_vjp
    def convert(x):
        return x

    convert.defvjp(lambda x: (x, None), lambda _, dy: (dy.astype(dtype),))
    return convert
