"""A training step of a transformers model with our attention (issue 28):
a Llama 1B-shaped config (22 layers, hidden 2048, 32 query heads on 4 KV
heads, head dim 64, random weights, bf16), B1 T4096, forward+backward of
the language-model loss.  transformers' ``sdpa`` beside ours
(``attn_implementation="twinkernels"``, torch_api.integrations.transformers)
on one document and on 4 packed documents: packing told by restarting
``position_ids``, and for ours also by ``cu_seq_lens_*`` as transformers
passes them to ``flash_attention_2``.  transformers 5.17's ``sdpa`` (and
``eager``) read restarting ``position_ids`` for the rotary positions only:
without a mask their documents attend to each other, so that row runs
plain causal attention, as fast as one document.  The row that keeps the
documents apart on sdpa passes a 4-D block-diagonal causal mask (``block
mask``, :func:`block_mask`).  Tokens/s from the median step time over
interleaved rounds (every case once a round, 3 steps each).
``python -m bench transformers_step``.
"""

from __future__ import annotations

import statistics

import numpy as np

from bench.common import markdown_table, save, time_per_call

T, DOCS = 4096, 4
ROUNDS = 5
CASES = (
    ("sdpa", 1, "positions"),
    ("twinkernels", 1, "positions"),
    ("sdpa", DOCS, "positions"),
    ("sdpa", DOCS, "block mask"),
    ("twinkernels", DOCS, "positions"),
    ("twinkernels", DOCS, "cu_seq_lens"),
)


def _model(torch, transformers):
    cfg = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=T,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda()


def block_mask(torch, lens, device=None):
    """The 4-D boolean mask ``[1, 1, T, T]`` (True: attend) of causal
    attention within each of the packed documents of lengths ``lens``: what
    sdpa needs to keep them apart."""
    counts = torch.as_tensor(lens, device=device)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=device), counts)
    t = torch.arange(len(doc), device=device)
    return ((doc[:, None] == doc[None, :]) & (t[None, :] <= t[:, None]))[None, None]


def _inputs(torch, docs):
    lens = np.full(docs, T // docs)
    lens[-1] += T - lens.sum()
    pos = np.concatenate([np.arange(n) for n in lens])
    cu = np.concatenate([[0], np.cumsum(lens)])
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32000, (1, T), generator=g).cuda()
    positions = torch.tensor(pos[None]).cuda()
    return ids, positions, torch.tensor(cu, dtype=torch.int32).cuda(), int(lens.max()), lens


def run(progress=None) -> list[dict]:
    import torch
    import transformers

    from torch_api.integrations.transformers import register

    register()
    model = _model(torch, transformers)
    steps = {}
    for impl, docs, packing in CASES:
        ids, pos, cu, longest, lens = _inputs(torch, docs)
        extra = {}
        if packing == "cu_seq_lens":
            extra = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        elif packing == "block mask":
            extra = dict(attention_mask=block_mask(torch, lens, "cuda"))

        def step(ids=ids, pos=pos, extra=extra):
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, position_ids=pos, labels=ids, **extra).loss
            loss.backward()
            return loss

        steps[impl, docs, packing] = step
    # Interleaved rounds, each case's median kept: the step's wall time
    # drifted by several ms between cases timed one after the other.
    samples = {case: [] for case in steps}
    failed = {}
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    for _ in range(ROUNDS):
        for case, step in steps.items():
            if case in failed:
                continue
            try:
                model.set_attn_implementation(case[0])
                samples[case].append(time_per_call(step, sync, iters=3, reps=1, warmup=1))
            except Exception as e:  # one failing case must not hide the rest
                failed[case] = f"error: {type(e).__name__}: {str(e)[:100]}"
    rows = []
    for (impl, docs, packing), times in samples.items():
        row = {"attention": impl, "docs": docs, "packing": packing}
        if (impl, docs, packing) in failed:
            row["step ms"] = failed[impl, docs, packing]
        else:
            t = statistics.median(times)
            row.update({"step ms": f"{t * 1e3:.1f}", "tokens/s": f"{T / t:,.0f}"})
            row["rounds ms"] = " ".join(f"{x * 1e3:.1f}" for x in times)
        rows.append(row)
        print(row, flush=True)
        if progress is not None:
            progress.update(1)
    for r in rows:
        for packing, col in (("positions", "vs sdpa"), ("block mask", "vs sdpa block mask")):
            want = ("sdpa", r["docs"], packing)
            base = next((b for b in rows if (b["attention"], b["docs"], b["packing"]) == want), None)
            if base is not None and "tokens/s" in r and "tokens/s" in base:
                r[col] = f"{float(base['step ms']) / float(r['step ms']):.2f}x"
    save("transformers_step", rows, {"device": torch.cuda.get_device_name(), "T": T})
    cols = [
        *("attention", "docs", "packing", "step ms", "tokens/s"),
        *("vs sdpa", "vs sdpa block mask", "rounds ms"),
    ]
    print(markdown_table(rows, cols))
    return rows


def count() -> int:
    return len(CASES)
