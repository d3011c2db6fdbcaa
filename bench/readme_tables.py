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


def _ratio_range(tflops, ours, other, lengths) -> str:
    """``"lo-hix"``: the range of ``ours``' TFLOP/s over ``other``'s across
    the cases (mode, mask) at ``lengths``."""
    ratios = [
        float(tflops[(m, c, t, ours)]) / float(v)
        for (m, c, t, i), v in tflops.items()
        if i == other and t in lengths
    ]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def speed_block(results: pathlib.Path = RESULTS) -> str:
    """The README's block: the table and the claims it supports."""
    data = json.loads(results.read_text())
    rows, meta = data["rows"], data["meta"]
    # TFLOP/s as saved, by (mode, causal, T, impl); rows the run skipped have none.
    tflops = {(r["mode"], r["causal"], r["T"], r["impl"]): r["TFLOP/s"] for r in rows if "TFLOP/s" in r}
    lengths = sorted({r["T"] for r in rows})
    head = "| T, mask | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for t in lengths:
        for causal in (False, True):
            cells = [
                f"{tflops[('fwd', causal, t, impl)]} / {tflops[('fwd+bwd', causal, t, impl)]}"
                for impl, _ in COLUMNS
            ]
            lines.append(f"| {t // 1024}k {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    short, long = lengths[0], lengths[1:] or lengths[:1]

    def claim(impl, other, at):
        return _ratio_range(tflops, impl, other, at)

    text = (
        f"On one {meta['device']} ({meta['dtype']}, B{meta['B']} H{meta['H']} D{meta['D']}, TFLOP/s, "
        f"forward / forward+backward, one run: `docs/{results.name}`):\n\n" + "\n".join(lines) + "\n\n"
        f"From T = {long[0] // 1024}k on, ours runs at {claim('twinkernels torch', 'sdpa flash', long)} "
        f"(PyTorch binding) and {claim('twinkernels jax', 'sdpa flash', long)} (JAX) of SDPA's "
        f"FlashAttention-2 back end, and {claim('twinkernels torch', 'sdpa cudnn', long)} of cuDNN "
        f"(forward and forward+backward, full and causal). At T = {short // 1024}k the eager "
        f"PyTorch binding's host time shows: {claim('twinkernels torch', 'sdpa flash', [short])} of "
        "FlashAttention-2."
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
