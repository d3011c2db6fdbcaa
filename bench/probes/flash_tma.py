"""Issue 15's experiment: the tensor-descriptor kernels
(core_triton.attention.flash_fwd_tma / flash_bwd_tma, opt in) against
today's kernels, SDPA's cuDNN and flash (FA2) back ends, in one run.
bfloat16, B=4, H=16, D=128 (and 64), T = 2k, 8k, 16k, causal or not;
forward with each forward config of FWD_CONFIGS, forward+backward with each
backward config of BWD_CONFIGS (and the TMA forward).  Prints TFLOP/s, the
ratio to cuDNN, and the largest difference of the output (forward) or dQ
(forward+backward) from today's kernels: a wrong candidate shows there.
Not in ``nox -s bench``: ``python -m bench.probes.flash_tma [fwd|fwd+bwd] [T ...]``.
"""

from __future__ import annotations

import sys

from bench.common import markdown_table, save, time_per_call

B, H = 4, 16
SEQ_LENS = [2048, 8192, 16384]
MODES = ("fwd", "fwd+bwd")
# (BM, BN, num_warps, num_stages) per head dim; the first is flash_tma_plans.TMA_CONFIGS'.
FWD_CONFIGS = {
    128: [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
    64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 3)],
}
# (dK/dV config, dQ config); dK/dV's BN a multiple of its BM, dQ's BM of its BN.
BWD_CONFIGS = {
    128: [
        ((64, 128, 8, 2), (128, 64, 8, 2)),
        ((64, 128, 8, 3), (128, 64, 8, 3)),
        ((32, 128, 4, 2), (128, 32, 8, 2)),
    ],
    64: [
        ((64, 128, 8, 2), (128, 64, 8, 2)),
        ((64, 128, 4, 3), (128, 64, 4, 3)),
        ((128, 128, 8, 2), (128, 128, 8, 2)),
    ],
}


def _flops(T, D, causal, mode):
    f = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def run(modes=MODES, seq_lens=SEQ_LENS) -> list[dict]:
    import torch

    import torch_api
    from core_triton.attention import flash, flash_tma_plans

    fwd, bwd = dict(flash_tma_plans.TMA_CONFIGS), dict(flash_tma_plans.TMA_BWD_CONFIGS)
    rows = []
    try:
        for mode in modes:
            for D in (128, 64):
                for causal in (False, True):
                    for T in seq_lens:
                        rows += _case(torch, torch_api, flash, mode, D, causal, T)
    finally:
        flash.set_tma_forward(False, fwd)
        flash.set_tma_backward(False, bwd)
    _ratios(rows)
    save("flash_tma", rows, {"device": torch.cuda.get_device_name(), "B": B, "H": H, "dtype": "bfloat16"})
    print(markdown_table(rows, ["mode", "D", "causal", "T", "impl", "ms", "TFLOP/s", "vs cudnn", "max diff"]))
    return rows


def _case(torch, torch_api, flash, mode, D, causal, T) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn((B, T, H, D), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    leaves = [x.detach().requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]
    heads_first = [x.detach().transpose(1, 2).requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]

    def ours():
        out = torch_api.flash_attention(*leaves, causal=causal)
        return out if mode == "fwd" else torch.autograd.grad(out, leaves, do)[0]

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(*heads_first, is_causal=causal)
            return out if mode == "fwd" else torch.autograd.grad(out, heads_first, do.transpose(1, 2))[0]

        return call

    flash.set_tma_forward(False)
    flash.set_tma_backward(False)
    want = ours()
    # (name, forward config or None, backward configs or None)
    cases = [("ours today", None, None)]
    if mode == "fwd":
        cases += [(f"ours tma {c}", c, None) for c in FWD_CONFIGS[D]]
    else:
        cases += [("ours tma fwd, today's bwd", FWD_CONFIGS[D][0], None)]
        cases += [(f"ours tma {c}", FWD_CONFIGS[D][0], c) for c in BWD_CONFIGS[D]]
    rows = []
    for name, fwd, bwd in cases + [("sdpa cudnn", None, None), ("sdpa flash", None, None)]:
        row = {"mode": mode, "D": D, "causal": causal, "T": T, "impl": name}
        try:
            if name.startswith("sdpa"):
                backend = SDPBackend.CUDNN_ATTENTION if "cudnn" in name else SDPBackend.FLASH_ATTENTION
                fn = sdpa(backend)
            else:
                flash.set_tma_forward(fwd is not None, {D: fwd} if fwd else None)
                flash.set_tma_backward(bwd is not None, {D: bwd} if bwd else None)
                fn = ours
                row["max diff"] = f"{(fn().float() - want.float()).abs().max().item():.2e}"
            t = time_per_call(
                fn, lambda _: torch.cuda.synchronize(), iters=5 if T >= 8192 else 10, reps=3, warmup=2
            )
            row["ms"] = f"{t * 1e3:.3f}"
            row["TFLOP/s"] = f"{_flops(T, D, causal, mode) / t / 1e12:.0f}"
        except Exception as e:  # one failing candidate must not hide the rest
            row["ms"] = f"error: {type(e).__name__}: {str(e)[:100]}"
        print(row, flush=True)
        rows.append(row)
    flash.set_tma_forward(False)
    flash.set_tma_backward(False)
    torch.cuda.empty_cache()
    return rows


def _ratios(rows):
    key = lambda r: (r["mode"], r["D"], r["causal"], r["T"])  # noqa: E731
    base = {key(r): r.get("TFLOP/s") for r in rows if r["impl"] == "sdpa cudnn"}
    for r in rows:
        b = base.get(key(r))
        if b and "TFLOP/s" in r:
            r["vs cudnn"] = f"{float(r['TFLOP/s']) / float(b):.2f}x"


if __name__ == "__main__":
    args = sys.argv[1:]
    modes = tuple(a for a in args if a in MODES) or MODES
    run(modes, [int(a) for a in args if a not in MODES] or SEQ_LENS)
