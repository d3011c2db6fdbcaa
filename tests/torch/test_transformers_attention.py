"""flash_attention as a transformers attention backend
(torch_api.integrations.transformers), tested through transformers' own
model code: tiny random models built from configs (nothing downloaded).

The reference is the same model in float64 with transformers' ``eager``
attention (its plain softmax, with its own masks, windows and caps), or
``sdpa`` where left padding leaves a query no key; ours runs in float32
with ``attn_implementation="twinkernels"``.
Logits (real tokens only: a padding query's output is never used) and
every parameter's gradient of a loss on the real tokens, with left and
right padding; ``generate`` with the cache gives the reference's tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.integrations import assert_grads_close, check_optional_dependency
from tests.reference import assert_close

transformers = pytest.importorskip("transformers")
integration = pytest.importorskip("torch_api.integrations.transformers")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB, T = 64, 12


def _config(kind):
    """(config, kind of model) of each tiny model: a GQA decoder (Llama),
    one with a sliding window shorter than the sequence (Mistral), one with
    soft-capped logits and alternating windows (Gemma 2), an encoder
    (BERT: non-causal)."""
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=64)  # fmt: skip
    if kind == "llama":
        return transformers.LlamaConfig(**small, num_key_value_heads=2)
    if kind == "mistral":
        return transformers.MistralConfig(**small, num_key_value_heads=2, sliding_window=5)
    if kind == "gemma2":
        return transformers.Gemma2Config(
            **small, num_key_value_heads=2, head_dim=8, sliding_window=5, attn_logit_softcapping=3.0,
            final_logit_softcapping=None, query_pre_attn_scalar=8,
        )  # fmt: skip
    if kind == "bert":
        return transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64,
        )  # fmt: skip
    raise ValueError(kind)


def _pair(kind, seed=0, reference="eager"):
    """(reference in float64 on ``reference`` attention, ours in float32),
    same weights."""
    integration.register()
    cfg = _config(kind)
    cls = transformers.AutoModel if kind == "bert" else transformers.AutoModelForCausalLM
    torch.manual_seed(seed)
    # A config each: a model keeps (and set_attn_implementation changes) it.
    ref = cls.from_config(copy.deepcopy(cfg), attn_implementation=reference).to(DEVICE, torch.float64)
    ours = cls.from_config(copy.deepcopy(cfg), attn_implementation="twinkernels").to(DEVICE, torch.float32)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    return ref.eval(), ours.eval()


def _batch(padding, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (3, T), generator=gen)
    mask = torch.ones(3, T, dtype=torch.long)
    if padding == "left":
        mask[1, :4], mask[2, :1] = 0, 0
    elif padding == "right":
        mask[1, -4:], mask[2, -1:] = 0, 0
    return ids.to(DEVICE), mask.to(DEVICE)


def _logits(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


CASES = [("llama", "left"), ("llama", "right"), ("llama", "none"), ("mistral", "left"),
         ("gemma2", "right"), ("bert", "right")]  # fmt: skip


@pytest.mark.parametrize("kind,padding", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_logits_and_gradients_match_eager(kind, padding):
    # Left padding leaves the first padding queries with no key at all:
    # eager attention gives them NaN, which its next layer spreads to every
    # token (0 x NaN); sdpa's backend gives them zeros, so it is the
    # reference there (it has no soft cap: Gemma 2 takes right padding).
    ref, ours = _pair(kind, reference="sdpa" if padding == "left" else "eager")
    ids, mask = _batch(padding)
    real = mask.bool()
    got = {}
    for name, model in (("ref", ref), ("ours", ours)):
        model.zero_grad()
        out = _logits(model, ids, mask)
        # A loss on real tokens only, with weights that are not all ones.
        w = torch.linspace(0.5, 1.5, out.shape[-1], device=DEVICE, dtype=out.dtype)
        (out[real] * w).square().sum().backward()
        grads = {
            n: p.grad.detach().double().cpu().numpy()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
        got[name] = out[real].detach().double().cpu().numpy(), grads
    assert_close(got["ours"][0], got["ref"][0], "float32", "logits")
    assert got["ours"][1].keys() == got["ref"][1].keys()
    # Float64 reference: a zero gradient (the key bias's) is 1e-18 there.
    names = list(got["ref"][1])
    ref_grads, our_grads = ([got[w][1][n] for n in names] for w in ("ref", "ours"))
    assert_grads_close(our_grads, ref_grads, "float32", names, zero_below=1e-9)


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 through the GPU's compiled kernels")
@pytest.mark.parametrize("kind,padding", [("llama", "right"), ("gemma2", "left")])
def test_bfloat16_on_the_gpu_matches_sdpa(kind, padding):
    """The models in bf16 on the GPU, as they train: ours against the same
    bf16 model on ``sdpa`` (both round every other layer alike), logits
    and every parameter's gradient within bf16's tolerance."""
    integration.register()
    cfg = _config(kind)
    torch.manual_seed(3)
    models = {}
    for name in ("sdpa", "twinkernels"):
        torch.manual_seed(3)
        models[name] = transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation=name
        ).to(DEVICE, torch.bfloat16)
    ids, mask = _batch(padding, seed=5)
    real = mask.bool()
    got = {}
    for name, model in models.items():
        out = _logits(model, ids, mask)
        w = torch.linspace(0.5, 1.5, out.shape[-1], device=DEVICE, dtype=out.dtype)
        (out[real].float() * w).square().sum().backward()
        grads = {n: p.grad.double().cpu().numpy() for n, p in model.named_parameters() if p.grad is not None}
        got[name] = out[real].double().detach().cpu().numpy(), grads
    assert_close(got["twinkernels"][0], got["sdpa"][0], "bfloat16", "logits")
    names = list(got["sdpa"][1])
    ref_grads, our_grads = ([got[w][1][n] for n in names] for w in ("sdpa", "twinkernels"))
    assert_grads_close(our_grads, ref_grads, "bfloat16", names, zero_below=1e-2)


def test_sinks_gpt_oss_match_eager():
    # gpt-oss: a learned sink logit per query head (s_aux) and alternating
    # sliding windows.  Its experts multiply with torch._grouped_mm, which
    # has no float64: the reference is eager attention in float32 here.
    integration.register()
    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    torch.manual_seed(7)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation="twinkernels"
    )
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n.endswith("sinks"):
                p.normal_()  # initialised to zeros: give them weight
    ours.load_state_dict(ref.state_dict())
    ids, mask = _batch("right", seed=8)
    got = {}
    for name, model in (("ref", ref.to(DEVICE).eval()), ("ours", ours.to(DEVICE).eval())):
        out = _logits(model, ids, mask)
        out[mask.bool()].square().sum().backward()
        sinks = [p.grad.double().cpu().numpy() for n, p in model.named_parameters() if n.endswith("sinks")]
        got[name] = out[mask.bool()].detach().double().cpu().numpy(), sinks
    assert_close(got["ours"][0], got["ref"][0], "float32", "logits")
    assert len(got["ref"][1]) == 2
    for i, g in enumerate(got["ref"][1]):
        assert_close(got["ours"][1][i], g, "float32", f"grad sinks {i}")


@pytest.mark.parametrize("kind", ["mistral"])
def test_generate_with_cache_matches_eager(kind):
    # Left padding (as generate wants): a prefill, then one-token steps
    # against the cache, new queries at the keys' end.  Float32 both, so
    # that greedy choices meet no float64-vs-float32 near-tie.
    ref, ours = _pair(kind, seed=3)
    ref = ref.float()
    ids, mask = _batch("left", seed=4)
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    expected = ref.generate(ids, **kw)
    assert torch.equal(ours.generate(ids, **kw), expected)


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_generate_steps_run_through_decode_attention(kind, monkeypatch):
    # No padding: transformers' mask function passes no mask, so the
    # prefill runs through flash_attention and each one-token step through
    # decode_attention (Gemma 2: soft cap, and a window on every other
    # layer, shorter than the generated sequence).  Scores of every step
    # and the tokens as the reference's (float32 both: no near-tie).
    ref, ours = _pair(kind, seed=3)
    ref = ref.float()
    ids, _ = _batch("none", seed=4)
    calls = {"flash": 0, "decode": 0}

    def counted(name):
        real = getattr(integration, f"{name}_attention")

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    for name in calls:
        monkeypatch.setattr(integration, f"{name}_attention", counted(name))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_scores=True)  # fmt: skip
    expected, got = ref.generate(ids, **kw), ours.generate(ids, **kw)
    layers = ours.config.num_hidden_layers
    assert calls == {"flash": layers, "decode": 3 * layers}
    assert torch.equal(got.sequences, expected.sequences)
    for step, (a, b) in enumerate(zip(got.scores, expected.scores, strict=True)):
        assert_close(a.double().cpu().numpy(), b.double().cpu().numpy(), "float32", f"scores {step}")


@pytest.mark.parametrize("boundaries", [True, False], ids=["cu_seq_lens", "position_ids"])
def test_packed_sequences_match_separate_sequences(boundaries):
    # transformers' flattened batches (DataCollatorWithFlattening): one row
    # of three sequences with position ids restarting, with or without
    # cu_seq_lens_* (flash-attn kwargs); each sequence must come out as it
    # does alone through the reference.
    ref, ours = _pair("llama", seed=5)
    lengths = [5, 3, 4]
    ids, _ = _batch("none", seed=6)
    row = ids[0, : sum(lengths)][None]
    cu = torch.tensor([0, 5, 8, 12], dtype=torch.int32, device=DEVICE)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(DEVICE)
    extra = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5) if boundaries else {}
    packed = ours(input_ids=row, position_ids=positions, **extra).logits[0]
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = ref(input_ids=row[:, a:b]).logits[0]
        assert_close(
            packed[a:b].detach().double().cpu().numpy(), alone.detach().cpu().numpy(), "float32", "packed"
        )


def test_step_bench_block_mask_keeps_sdpa_documents_apart():
    # bench.transformers_step's sdpa baseline for packed documents: with the
    # block mask it must compute what ours computes on the packing (each
    # document as alone), else the bench would time other attention.
    from bench.transformers_step import block_mask

    ref, ours = _pair("llama", seed=7, reference="sdpa")
    lengths = [5, 3, 4]
    ids, _ = _batch("none", seed=8)
    row = ids[0, : sum(lengths)][None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(DEVICE)
    mask = block_mask(torch, lengths, DEVICE)
    assert mask.shape == (1, 1, 12, 12) and mask.dtype == torch.bool
    masked = ref(input_ids=row, position_ids=positions, attention_mask=mask).logits[0]
    packed = ours(input_ids=row, position_ids=positions).logits[0]
    got, want = packed.detach().double().cpu().numpy(), masked.detach().cpu().numpy()
    assert_close(got, want, "float32", "block mask")


def test_packed_ids_made_once_a_forward(monkeypatch):
    # Every layer gets the same position_ids: the segment ids are made once
    # (the same tensor back, so flash_attention's ranges are made once too,
    # torch_api._flash); positions changed in place, or a new tensor, are
    # honoured: each packing must come out as its sequences do alone.
    from core_triton.attention.segment_ranges import segment_ranges_kernel
    from torch_api import _flash
    from torch_api.integrations.transformers_inputs import packed_segments

    launched = []

    def spy(plan, inputs, real=_flash.launch):
        launched.append(getattr(plan.kernel, "fn", plan.kernel))
        return real(plan, inputs)

    monkeypatch.setattr(_flash, "launch", spy)
    ref, ours = _pair("llama", seed=7)
    ids, _ = _batch("none", seed=8)
    row = ids[:1, :12]
    positions = torch.cat([torch.arange(n) for n in (5, 7)])[None].to(DEVICE)
    for lengths in ((5, 7), (8, 4)):
        positions[0] = torch.cat([torch.arange(n) for n in lengths])  # in place, the same tensor
        launched.clear()
        packed = ours(input_ids=row, position_ids=positions).logits[0]
        assert launched.count(getattr(segment_ranges_kernel, "fn", segment_ranges_kernel)) == 1, lengths
        starts = [0, lengths[0], 12]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            alone = ref(input_ids=row[:, a:b]).logits[0]
            assert_close(
                packed[a:b].detach().double().cpu().numpy(), alone.detach().cpu().numpy(), "float32", "packed"
            )
    seg = packed_segments(positions)
    assert packed_segments(positions) is seg
    assert packed_segments(positions.clone()) is not seg
    with torch.inference_mode():
        frozen = positions.clone()
        assert torch.equal(packed_segments(frozen), seg) and packed_segments(frozen) is not seg


def test_padding_ids_made_once_a_forward(monkeypatch):
    # Every layer gets the same 2-D padding mask: its segment ids (and so
    # their ranges) are made once; a mask changed in place is honoured.
    from core_triton.attention.segment_ranges import segment_ranges_kernel
    from torch_api import _flash

    launched = []

    def spy(plan, inputs, real=_flash.launch):
        launched.append(plan.kernel is segment_ranges_kernel)
        return real(plan, inputs)

    monkeypatch.setattr(_flash, "launch", spy)
    ref, ours = _pair("llama", seed=9, reference="sdpa")
    ids, mask = _batch("right", seed=10)
    for padding in ("right", "left"):
        mask.copy_(_batch(padding)[1])  # in place, the same tensor
        launched.clear()
        got = _logits(ours, ids, mask)
        assert launched.count(True) == 1, padding
        want = _logits(ref, ids, mask)
        real = mask.bool()
        assert_close(got[real].detach().double().cpu().numpy(), want[real].detach().cpu().numpy(), "float32")
    # transformers hands the layers a mask of its own each forward; the
    # ids themselves, for a mask changed in place:
    from torch_api.integrations.transformers_inputs import padding_segments

    q_seg, kv_seg = padding_segments(mask, T - 2, T)
    assert padding_segments(mask, T - 2, T) == (q_seg, kv_seg)
    mask.copy_(_batch("right")[1])
    again = padding_segments(mask, T - 2, T)
    assert not torch.equal(again[1], kv_seg) and torch.equal(again[1], (mask ^ mask[:, :1]).int())
    assert padding_segments(mask, T, T)[1] is not again[1]  # other lengths


def test_what_it_cannot_take_is_refused():
    integration.register()
    _, ours = _pair("llama")
    ids, mask = _batch("none")
    with pytest.raises(ValueError, match="output_attentions"):
        ours(input_ids=ids, output_attentions=True)
    q = torch.randn(1, 4, 3, 8, device=DEVICE)
    module = ours.model.layers[0].self_attn
    with pytest.raises(ValueError, match="dropout"):
        integration.attention_forward(module, q, q, q, None, dropout=0.1)
    with pytest.raises(ValueError, match="2-D padding mask"):
        integration.attention_forward(module, q, q, q, torch.zeros(1, 1, 3, 3, device=DEVICE))


def test_optional_dependency(monkeypatch):
    check_optional_dependency(monkeypatch, "torch_api.integrations.transformers", "transformers", "torch_api")
