"""What transformers' attention modules pass, turned into twinkernels'
arguments (torch_api.integrations.transformers): the window, and segment
ids from position ids or from a padding mask, made on the device (no host
read of the ids or the mask)."""

from __future__ import annotations

import torch

from torch_api._reuse import LastMade


def window(sliding_window: int | None, causal: bool) -> tuple[int, int] | None:
    """transformers' ``sliding_window`` (a query sees the keys after ``q -
    w``) as ours (the keys on each side besides the query's own)."""
    if sliding_window is None:
        return None
    left = int(sliding_window) - 1
    return (left, 0) if causal else (left, left)


# Segment ids made once a forward: every layer gets the same
# ``position_ids`` (or padding mask) tensor; the same ids tensor back also
# lets flash_attention reuse their ranges (torch_api._reuse).
_PACKED, _PADDING = LastMade(), LastMade()


def packed_segments(positions: torch.Tensor) -> torch.Tensor:
    """Segment ids ``[1, T]`` int32 of a flattened batch given by position
    ids that restart: a sequence starts where a position does not follow
    the one before (transformers' flash-attn backend reads packing from
    position ids too).  The same tensor object for the same, unchanged
    ``positions`` as the call before."""

    def make():
        step = torch.diff(positions.reshape(1, -1), dim=-1) != 1
        first = torch.zeros(1, 1, dtype=torch.int32, device=positions.device)
        return torch.cat([first, torch.cumsum(step.to(torch.int32), dim=-1, dtype=torch.int32)], dim=-1)

    return _PACKED.get((positions,), None, make)


def padding_segments(attention_mask: torch.Tensor, Tq: int, Tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_segment_ids [B, Tq], kv_segment_ids [B, Tk])`` int32 of a 2-D
    padding mask ``[B, >= Tk]`` (true or 1 where a token is real).

    Real tokens in one segment, padding in the other: a real query sees only
    real keys; a padding query's output is never used.  The row's first
    token is in segment 0, so that left and right padding both give ids that
    never decrease along the row: the kernels then find each segment's keys
    by search and skip the rest (one segment, no padding, runs as plain
    attention).  The same tensors for the same, unchanged mask and lengths
    as the call before."""
    if attention_mask.dim() != 2:
        raise ValueError(
            "twinkernels attention takes a 2-D padding mask [batch, keys], got one of shape "
            f"{tuple(attention_mask.shape)} (a dense mask: use attn_implementation='sdpa')"
        )

    def make():
        kv_seg = attention_mask[:, -Tk:].to(torch.int32)
        kv_seg = kv_seg ^ kv_seg[:, :1]
        return kv_seg[:, -Tq:].contiguous(), kv_seg.contiguous()

    return _PADDING.get((attention_mask,), (Tq, Tk), make)
