"""The README's speed tables, written from the benchmarks' saved results,
so that every figure in them can be traced to one run: the attention table
(docs/bench-attention-h100.json, what ``python -m bench attention`` saved
on the H100) and the Hopper flash table (docs/bench-flash-h200-46th-groups.json,
what ``python -m bench flash`` saved on the H200 with the Gluon kernels).

The sentence on segment ids comes from docs/bench-segments-h200-persistent.json
(``python -m bench segments`` on the H200, the persistent Gluon forward in
plain attention and in the gated pairs of segment ids).

``python -m bench.readme_tables`` rewrites the blocks between the README's
``<!-- speed-table -->``, ``<!-- flash-table -->`` and
``<!-- segments-claim -->`` markers;
tests/core/test_readme_tables.py checks that the README holds what this
writes."""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "bench-attention-h100.json"
FLASH_RESULTS = ROOT / "docs" / "bench-flash-h200-46th-groups.json"
SEGMENTS_RESULTS = ROOT / "docs" / "bench-segments-h200-persistent.json"
START, END = "<!-- speed-table: written by python -m bench.readme_tables -->", "<!-- /speed-table -->"
FLASH_START = "<!-- flash-table: written by python -m bench.readme_tables -->"
FLASH_END = "<!-- /flash-table -->"
SEGMENTS_START = "<!-- segments-claim: written by python -m bench.readme_tables -->"
SEGMENTS_END = "<!-- /segments-claim -->"
COLUMNS = [("twinkernels torch", "ours (torch)"), ("twinkernels jax", "ours (JAX)"),
           ("sdpa cudnn", "SDPA cuDNN"), ("sdpa flash", "SDPA flash (FA2)")]  # fmt: skip


def _span(values) -> str:
    """``"lo-hix"``: the range of ``values``."""
    return f"{min(values):.2f}-{max(values):.2f}x"


def _ratio_range(tflops, ours, other, lengths) -> str:
    """``"lo-hix"``: the range of ``ours``' TFLOP/s over ``other``'s across
    the cases (mode, mask) at ``lengths``."""
    return _span(
        [
            float(tflops[(m, c, t, ours)]) / float(v)
            for (m, c, t, i), v in tflops.items()
            if i == other and t in lengths
        ]
    )


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


def flash_block(results: pathlib.Path = FLASH_RESULTS) -> str:
    """The README's Hopper block: per case and mode, each binding's time and
    its ratio to cuDNN in the same framework (SDPA's for PyTorch,
    ``jax.nn``'s for JAX), as ``python -m bench flash`` saved them."""
    data = json.loads(results.read_text())
    by = {}
    for r in data["rows"]:
        by.setdefault((r["case"], r["mode"]), {})[r["impl"]] = r
    impls = ("twinkernels torch", "twinkernels jax", "sdpa cudnn", "jax cudnn")
    lines = [
        "| case | mode | ours (torch) | ours (JAX) | SDPA cuDNN | jax.nn cuDNN |",
        "|---|---|---|---|---|---|",
    ]
    ratios = {}
    for (case, mode), row in by.items():
        cells = []
        for impl in impls:
            r = row[impl]
            if "vs cuDNN" in r and "cudnn" not in impl:
                cells.append(f"{r['ms']} ({r['vs cuDNN']})")
                ratios.setdefault(mode, []).append(float(r["vs cuDNN"]))
            else:
                cells.append(r["ms"])
        lines.append(f"| {case} | {mode} | " + " | ".join(cells) + " |")

    text = (
        f"On one {data['meta']['device']} ({data['meta']['dtype']}, ms, in brackets the ratio of speed "
        "to cuDNN in the same framework; one run of `python -m bench flash`: "
        f"`docs/{results.name}`), with the Gluon kernels for Hopper (the forward at head dims 128 "
        "and 64, the backward at 128; docs/design.md):\n\n" + "\n".join(lines) + "\n\n"
        f"Across these cases ours runs at {_span(ratios['fwd'])} of cuDNN forward and "
        f"{_span(ratios['fwd+bwd'])} forward+backward (both bindings)."
    )
    return f"{FLASH_START}\n{text}\n{FLASH_END}"


def segments_block(results: pathlib.Path = SEGMENTS_RESULTS) -> str:
    """The README's sentence on segment ids, from what ``python -m bench
    segments`` saved: time ratios of segment ids over ``cu_seqlens`` on the
    same documents, of one segment over plain attention, and of cuDNN with
    the equivalent dense mask over our segment ids (every case and binding,
    one call and chained layers)."""
    data = json.loads(results.read_text())
    rows = data["rows"]

    def pairs(key, docs_pick):
        fwd, both = [], []
        for r in rows:
            if r["input"] == "segment ids" and key in r and docs_pick(r["docs"]):
                a, b = (float(x) for x in r[key].split("/"))
                fwd.append(a)
                both.append(b)
        return fwd, both

    docs_fwd, docs_both = pairs("vs cu_seqlens", lambda n: n > 1)
    one_fwd, one_both = pairs("vs plain", lambda n: n == 1)
    key = ("T", "D", "docs", "layers", "binding")
    ours = {tuple(r[k] for k in key): float(r["fwd+bwd ms"]) for r in rows if r["input"] == "segment ids"}
    dense = [
        float(r["fwd+bwd ms"]) / ours[tuple(r[k] for k in key)]
        for r in rows
        if r["input"] == "cudnn" and r["docs"] > 1 and tuple(r[k] for k in key) in ours
    ]
    lengths = sorted({r["T"] for r in rows})
    dims = sorted({r["D"] for r in rows})
    text = (
        "Segment ids that never decrease (packed documents, padding at one end) take "
        f"{_span(docs_both)} of `cu_seqlens`' time on the same documents forward+backward and "
        f"{_span(docs_fwd)} forward; one segment takes {_span(one_both)} of plain attention's time "
        f"forward+backward and {_span(one_fwd)} forward (one {data['meta']['device']}, B1 "
        f"T{lengths[0] // 1024}k-{lengths[-1] // 1024}k, 32 query heads on 4, head dim "
        f"{' and '.join(map(str, dims))}, causal, both bindings, one call at a time and "
        f"{data['meta']['layers']} layers chained; one run of interleaved medians: `docs/{results.name}`), "
        f"where cuDNN with the equivalent dense mask takes {_span(dense)} of our forward+backward time."
    )
    return f"{SEGMENTS_START}\n{text}\n{SEGMENTS_END}"


BLOCKS = (
    (START, END, speed_block),
    (FLASH_START, FLASH_END, flash_block),
    (SEGMENTS_START, SEGMENTS_END, segments_block),
)


def main(argv):
    readme = ROOT / "README.md"
    text = readme.read_text()
    for start, end, block in BLOCKS:
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            sys.exit(f"README.md has no block between {start} and {end}")
        text = pattern.sub(lambda _, block=block: block(), text)
    readme.write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
