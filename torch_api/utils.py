"""Packed-sequence utilities on torch tensors.

``cu_seqlens`` is int32 ``[N+1]``: 0, then the running total of the sequence
lengths.  Zero-length sequences own no token and do not shift the ids of the
sequences after them.  Id-valued outputs are int32.
"""

from __future__ import annotations

import torch

from core_triton.common import checks
from core_triton.common.utils import cdiv as _cdiv
from torch_api._launch import info


def cdiv(a, b):
    """Ceiling division ``-(-a // b)`` of ints or integer tensors.

    Reference: docs/api.md#cdiv"""
    return _cdiv(a, b)


def _check_cu(cu_seqlens) -> torch.Tensor:
    i = info(cu_seqlens, "cu_seqlens")
    checks.check_cu_seqlens(i, batch=1)
    return cu_seqlens


def check_cu_seqlens(cu_seqlens: torch.Tensor, seq_len: int) -> None:
    """Raise ``ValueError`` unless ``cu_seqlens`` (int32/int64 ``[N+1]``) starts
    at 0, never decreases and ends at ``seq_len`` (the packed inputs' length);
    ``TypeError`` for another type or dtype.

    The ops never read ``cu_seqlens`` values on the host (that would wait for
    the GPU on every call): they clamp out-of-contract values, stay inside
    their tensors, and give 0 to tokens of no sequence.  Call this, once,
    where you want the error instead. It copies ``cu_seqlens`` to the host.

    Reference: docs/api.md#check_cu_seqlens"""
    _check_cu(cu_seqlens)
    checks.check_cu_seqlens_values(cu_seqlens.detach().cpu().numpy(), int(seq_len))


def _check_chunk(chunk_size) -> int:
    return checks.check_power_of_two(chunk_size, "chunk_size")


def prepare_lens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[N]`` sequence lengths of ``cu_seqlens`` (int32/int64 ``[N+1]``), in its
    dtype.

    Reference: docs/api.md#prepare_lens"""
    cu_seqlens = _check_cu(cu_seqlens)
    return cu_seqlens[1:] - cu_seqlens[:-1]


def prepare_lens_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int32: the number of true entries of each row of a ``[B, T]``
    mask.

    Reference: docs/api.md#prepare_lens_from_mask"""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    return (mask != 0).sum(-1, dtype=torch.int32)


def prepare_cu_seqlens_from_mask(mask: torch.Tensor, out_dtype=torch.int32) -> torch.Tensor:
    """``[B+1]`` cumulative lengths ``[0, cumsum(lens)]`` of the rows of a ``[B,
    T]`` mask, in ``out_dtype`` (default int32).

    Reference: docs/api.md#prepare_cu_seqlens_from_mask"""
    lens = prepare_lens_from_mask(mask)
    out = torch.zeros(lens.numel() + 1, dtype=out_dtype, device=mask.device)
    out[1:] = lens.cumsum(0)
    return out


def prepare_chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[N+1]`` int32 cumulative chunk counts of ``cu_seqlens`` (int32/int64
    ``[N+1]``) for chunks of ``chunk_size`` tokens (a positive power of two).

    Reference: docs/api.md#prepare_chunk_offsets"""
    chunk_size = _check_chunk(chunk_size)
    n_chunks = cdiv(prepare_lens(cu_seqlens), chunk_size)
    out = torch.zeros(n_chunks.numel() + 1, dtype=torch.int32, device=cu_seqlens.device)
    out[1:] = n_chunks.cumsum(0)
    return out


def _ids_over(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every slot ``0..offsets[-1]-1``: the segment that owns it and its
    index inside that segment (segments given by cumulative ``offsets``)."""
    total = int(offsets[-1])
    slots = torch.arange(total, dtype=offsets.dtype, device=offsets.device)
    # side=right skips empty segments: their end equals the next one's start.
    seg = torch.searchsorted(offsets[1:].contiguous(), slots, right=True)
    return seg.to(torch.int32), (slots - offsets[seg]).to(torch.int32)


def prepare_sequence_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[T]`` int32 sequence id of every token of ``cu_seqlens`` (int32/int64
    ``[N+1]``, ``T = cu_seqlens[-1]``).

    Reference: docs/api.md#prepare_sequence_ids"""
    return _ids_over(_check_cu(cu_seqlens))[0]


def prepare_position_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[T]`` int32 position of every token inside its sequence, for
    ``cu_seqlens`` (int32/int64 ``[N+1]``, ``T = cu_seqlens[-1]``).

    Reference: docs/api.md#prepare_position_ids"""
    return _ids_over(_check_cu(cu_seqlens))[1]


def prepare_token_indices(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[T, 2]`` int32 (sequence id, position) of every token, for
    ``cu_seqlens`` (int32/int64 ``[N+1]``).

    Reference: docs/api.md#prepare_token_indices"""
    return torch.stack(_ids_over(_check_cu(cu_seqlens)), dim=1)


def prepare_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[total_chunks, 2]`` int32 (sequence id, chunk index in the sequence) of
    every chunk of ``chunk_size`` tokens (a positive power of two), for
    ``cu_seqlens`` (int32/int64 ``[N+1]``).

    Reference: docs/api.md#prepare_chunk_indices"""
    return torch.stack(_ids_over(prepare_chunk_offsets(cu_seqlens, chunk_size)), dim=1)


class _IdentityDtypeConvert(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy.to(ctx.dtype), None


def identity_dtype_convert(dtype: torch.dtype):
    """Identity whose backward casts the cotangent to ``dtype`` (a torch.dtype).
    Autograd casts a gradient back to its input's dtype, so the cotangent's
    values are rounded through ``dtype``.

    Reference: docs/api.md#identity_dtype_convert"""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return lambda x: _IdentityDtypeConvert.apply(x, dtype)
