"""twinkernels' flash attention as a Hugging Face transformers attention
backend.

    import torch_api.integrations.transformers as tk_transformers
    tk_transformers.register()  # name "twinkernels"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="twinkernels")

:func:`register` adds :func:`attention_forward` to transformers' public
``AttentionInterface`` and, under the same name, a mask function to its
``AttentionMaskInterface`` that hands the attention the 2-D padding mask
(or None) rather than a dense ``[B, 1, Tq, Tk]`` mask, as transformers does
for flash-attn.  Then ``from_config(..., attn_implementation=name)`` and
``model.set_attn_implementation(name)`` pick it.

What it takes from transformers' attention modules: tensors ``[B, H, T, D]``
(GQA: fewer key/value heads), ``scaling``, ``is_causal`` (the module's, or
the call's), ``sliding_window`` (transformers' meaning: a query sees itself
and the ``w - 1`` keys before it), ``softcap``, ``s_aux`` sinks (one logit
per query head), a 2-D padding mask ``[B, Tk]`` (left or right padding:
turned into segment ids on the device, no dense mask), packed batches given
by ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (transformers'
``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``) or, at batch
1 without a mask, by position ids that restart (segment ids made on the
device), and a
KV cache: new queries sit at the end of the keys (causal alignment by
positions).  ``generate``'s steps of 1 to 16 new tokens per row against the
cache, without padding and without gradients, run through
``decode_attention`` (the cache read in place, one length per row); with
a padding mask (left-padded prompts) they run through ``flash_attention``
with segment ids and positions, since the decode kernel knows only each
row's length.  What it cannot take raises ``ValueError`` naming it:
dropout > 0, ``output_attentions``, a dense (non-2-D) mask.
"""

from __future__ import annotations

import torch

from torch_api.decode_attention import decode_attention
from torch_api.flash_attention import flash_attention
from torch_api.integrations.transformers_inputs import packed_segments, padding_segments, window

NAME = "twinkernels"
# decode_attention takes 1 to 16 new queries per row.
DECODE_MAX_QUERIES = 16


def _transformers():
    try:
        import transformers
    except ImportError as e:  # optional dependency
        raise ImportError(
            "torch_api.integrations.transformers needs Hugging Face transformers: "
            "pip install 'twinkernels[transformers]' (or transformers>=5.17)"
        ) from e
    return transformers


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, HQ, Tq, D]``,
    ``key``/``value [B, H, Tk, D]`` -> ``(output [B, Tq, HQ, Dv], None)``.
    ``attention_mask``: None or the 2-D ``[B, >= Tk]`` padding mask (true
    or 1 where a token is real) that :func:`register`'s mask function
    passes on."""
    if dropout:
        raise ValueError(
            f"twinkernels attention has no dropout; got dropout={dropout} (set attention_dropout=0)"
        )
    if kwargs.get("output_attentions"):
        raise ValueError("twinkernels attention cannot return attention weights (output_attentions=True)")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    Tq, Tk = q.shape[1], k.shape[1]
    options = dict(
        sliding_window=window(sliding_window, causal),
        causal=causal,
        logits_soft_cap=softcap,
        softmax_scale=scaling,
        softmax_aux=None if s_aux is None else s_aux.to(q.dtype),
    )
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None:
        if attention_mask is not None:
            raise ValueError("twinkernels attention: packed input (cu_seq_lens_q) with a padding mask")
        same = cu_k is None or cu_k is cu_q
        out = flash_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=None if same else cu_k, **options)
        return out, None
    positions = kwargs.get("position_ids")
    if attention_mask is None and positions is not None and q.shape[0] == 1 and Tq == Tk:
        # A flattened batch without cu_seq_lens (no host check of whether
        # there is more than one sequence).
        seg = packed_segments(positions)
        return flash_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, **options), None
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if attention_mask is None and causal and Tq < Tk and Tq <= DECODE_MAX_QUERIES and not grads:
        # A generate step without padding: the new queries are the cache's
        # last Tq tokens in every row (decode_attention's alignment).  The
        # transposed views read the [B, H, Tk, D] cache in place.
        kv_lens = torch.full((q.shape[0],), Tk, dtype=torch.int32, device=q.device)
        step = {n: options[n] for n in ("sliding_window", "logits_soft_cap", "softmax_scale", "softmax_aux")}
        out = decode_attention(q, k, v, kv_lens, **step)
        return out, None
    if Tq != Tk:
        # New queries after cached keys: they sit at the keys' end.
        options["q_positions"] = torch.arange(Tk - Tq, Tk, device=q.device, dtype=torch.int32)
        options["kv_positions"] = torch.arange(Tk, device=q.device, dtype=torch.int32)
    if attention_mask is not None:
        options["q_segment_ids"], options["kv_segment_ids"] = padding_segments(attention_mask, Tq, Tk)
    return flash_attention(q, k, v, **options), None


def register(name: str = NAME) -> str:
    """Make ``attn_implementation=name`` run :func:`attention_forward`
    (transformers' ``AttentionInterface``), with transformers' own
    flash-attn mask function under the same name (2-D padding mask or
    None).  Returns ``name``."""
    transformers = _transformers()
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    transformers.AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


_transformers()  # the ImportError that says what to install, at import
