"""twinkernels for JAX: the core_triton kernels as differentiable ops."""

from jax_api.chunk_global_cumsum import chunk_global_cumsum
from jax_api.chunk_linear_attn import chunk_linear_attn
from jax_api.chunk_local_cumsum import chunk_local_cumsum
from jax_api.decode_attention import decode_attention
from jax_api.flash_attention import flash_attention
from jax_api.gated_delta_rule import gated_delta_rule
from jax_api.gated_delta_rule_step import gated_delta_rule_step
from jax_api.lightning_attn import lightning_attn
from jax_api.recurrent import recurrent
from jax_api.ring_attention import ring_attention
from jax_api.ring_attention_mesh import ring_attention_mesh as ring_attention_mesh  # JAX only: not in __all__
from jax_api.utils import (
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
from jax_api.zigzag import zigzag_reorder, zigzag_restore

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
