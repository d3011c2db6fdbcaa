"""twinkernels for PyTorch: the core_triton kernels as differentiable ops."""

from torch_api.chunk_global_cumsum import chunk_global_cumsum
from torch_api.chunk_linear_attn import chunk_linear_attn
from torch_api.chunk_local_cumsum import chunk_local_cumsum
from torch_api.decode_attention import decode_attention
from torch_api.flash_attention import flash_attention
from torch_api.gated_delta_rule import gated_delta_rule
from torch_api.gated_delta_rule_step import gated_delta_rule_step
from torch_api.lightning_attn import lightning_attn
from torch_api.recurrent import recurrent
from torch_api.ring_attention import ring_attention
from torch_api.utils import (
    cdiv,
    check_cu_seqlens,
    identity_dtype_convert,
    prepare_chunk_indices,
    prepare_chunk_offsets,
    prepare_cu_seqlens_from_mask,
    prepare_lens,
    prepare_lens_from_mask,
    prepare_position_ids,
    prepare_sequence_ids,
    prepare_token_indices,
)
from torch_api.zigzag import zigzag_reorder, zigzag_restore

__all__ = [
    "cdiv",
    "check_cu_seqlens",
    "chunk_global_cumsum",
    "chunk_linear_attn",
    "chunk_local_cumsum",
    "decode_attention",
    "flash_attention",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "identity_dtype_convert",
    "lightning_attn",
    "prepare_chunk_indices",
    "prepare_chunk_offsets",
    "prepare_cu_seqlens_from_mask",
    "prepare_lens",
    "prepare_lens_from_mask",
    "prepare_position_ids",
    "prepare_sequence_ids",
    "prepare_token_indices",
    "recurrent",
    "ring_attention",
    "zigzag_reorder",
    "zigzag_restore",
]
