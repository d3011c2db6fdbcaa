"""The README's speed table, written from the benchmark's saved results
(docs/bench-attention-h100.json, what ``python -m bench attention`` saved
on the H100), so that every figure in it can be traced to one run.

``python -m bench.readme_tables`` rewrites the block between the README's
``<!-- speed-table -->`` markers; tests/core/test_readme_tables.py checks
that the README holds what this writes."""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "bench-attention-h100.json"
START, END = "<!-- speed-table: written by python -m bench.readme_tables -->", "<!-- /speed-table -->"
COLUMNS = [("twinkernels torch", "ours (torch)"), ("twinkernels jax", "ours (JAX)"),
           ("sdpa cudnn", "SDPA cuDNN"), ("sdpa flash", "SDPA flash (FA2)")]  # fmt: skip


def _ratio_range(rows, ours, other, keep):
    """(min, max) of ``ours``' TFLOP/s over ``other``'s across the cases
    ``keep`` accepts (same mode, mask and length)."""
    by = {(r["mode"], r["causal"], r["T"], r["impl"]): float(r["TFLOP/s"]) for r in rows if "TFLOP/s" in r}
    ratios = [
        by[(m, c, t, ours)] / by[(m, c, t, other)] for (m, c, t, i) in by if i == other and keep(m, c, t)
    ]
    return min(ratios), max(ratios)


def speed_block(results: pathlib.Path = RESULTS) -> str:
    """The README's block: the table and the claims it supports."""
    data = json.loads(results.read_text())
    rows, meta = data["rows"], data["meta"]
    by = {(r["mode"], r["causal"], r["T"], r["impl"]): r["TFLOP/s"] for r in rows if "TFLOP/s" in r}
    lengths = sorted({r["T"] for r in rows})
    head = "| T, mask | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for t in lengths:
        for causal in (False, True):
            cells = [
                f"{by[('fwd', causal, t, impl)]} / {by[('fwd+bwd', causal, t, impl)]}" for impl, _ in COLUMNS
            ]
            lines.append(f"| {t // 1024}k {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    long = lengths[1] if len(lengths) > 1 else lengths[0]

    def claim(impl, other, lo_t):
        lo, hi = _ratio_range(rows, impl, other, lambda m, c, t: t >= lo_t)
        return f"{lo:.2f}-{hi:.2f}x"

    short = lengths[0]
    s_lo, s_hi = _ratio_range(rows, "twinkernels torch", "sdpa flash", lambda m, c, t: t == short)
    text = (
        f"On one {meta['device']} ({meta['dtype']}, B{meta['B']} H{meta['H']} D{meta['D']}, TFLOP/s, "
        f"forward / forward+backward, one run: `docs/{results.name}`):\n\n" + "\n".join(lines) + "\n\n"
        f"From T = {long // 1024}k on, ours runs at {claim('twinkernels torch', 'sdpa flash', long)} "
        f"(PyTorch binding) and {claim('twinkernels jax', 'sdpa flash', long)} (JAX) of SDPA's "
        f"FlashAttention-2 back end, and {claim('twinkernels torch', 'sdpa cudnn', long)} of cuDNN "
        f"(forward and forward+backward, full and causal). At T = {short // 1024}k the eager "
        f"PyTorch binding's host time shows: {s_lo:.2f}-{s_hi:.2f}x of FlashAttention-2."
    )
    return f"{START}\n{text}\n{END}"


def main(argv):
    readme = ROOT / "README.md"
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        sys.exit(f"README.md has no block between {START} and {END}")
    readme.write_text(pattern.sub(lambda _: speed_block(), text))


if __name__ == "__main__":
    main(sys.argv[1:])
