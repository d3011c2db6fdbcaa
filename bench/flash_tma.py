"""Issue 15's experiment: the tensor-descriptor forward
(core_triton.attention.flash_fwd_tma, opt in) against today's forward,
SDPA's cuDNN and flash (FA2) back ends, in one run.  Forward only, bfloat16,
B=4, H=16, D=128 (and 64), T = 2k, 8k, 16k, causal or not; the TMA kernel
in each config of CONFIGS.  Prints TFLOP/s, the ratio to cuDNN, and the
largest difference from today's forward (a wrong candidate shows there).
Not in ``nox -s bench``: ``python -m bench.flash_tma [T ...]``.
"""

from __future__ import annotations

import sys

from bench.common import markdown_table, save, time_per_call

B, H = 4, 16
SEQ_LENS = [2048, 8192, 16384]
# (BM, BN, num_warps, num_stages) per head dim; the first is flash.TMA_CONFIGS'.
CONFIGS = {
    128: [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
    64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 3)],
}


def _flops(T, D, causal):
    return 4 * B * H * T * T * D * (0.5 if causal else 1.0)


def run(seq_lens=SEQ_LENS) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_api
    from core_triton.attention import flash

    rows = []
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    original = dict(flash.TMA_CONFIGS)
    try:
        rows = _sweep(torch, torch_api, flash, sdpa_kernel, SDPBackend, sync, seq_lens)
    finally:
        flash.set_tma_forward(False, original)
    _ratios(rows)
    save("flash_tma", rows, {"device": torch.cuda.get_device_name(), "B": B, "H": H, "dtype": "bfloat16"})
    print(markdown_table(rows, ["D", "causal", "T", "impl", "ms", "TFLOP/s", "vs cudnn", "max diff"]))
    return rows


def _sweep(torch, torch_api, flash, sdpa_kernel, SDPBackend, sync, seq_lens):
    rows = []
    for D in (128, 64):
        for causal in (False, True):
            for T in seq_lens:
                g = torch.Generator(device="cuda").manual_seed(0)
                shape = (B, T, H, D)
                bf16 = torch.bfloat16
                q, k, v = (torch.randn(shape, device="cuda", dtype=bf16, generator=g) for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                flash.set_tma_forward(False)
                want = torch_api.flash_attention(q, k, v, causal=causal)
                cases = [("ours today", None)] + [(f"ours tma {c}", c) for c in CONFIGS[D]]
                cases += [("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)]
                cases += [("sdpa flash", SDPBackend.FLASH_ATTENTION)]
                for name, what in cases:
                    row = {"D": D, "causal": causal, "T": T, "impl": name}
                    try:
                        if name.startswith("sdpa"):

                            def fn(backend=what, args=(qt, kt, vt), causal=causal):
                                with sdpa_kernel(backend):
                                    sdpa = torch.nn.functional.scaled_dot_product_attention
                                    return sdpa(*args, is_causal=causal)

                        else:
                            flash.set_tma_forward(what is not None, {D: what} if what else None)

                            def fn(args=(q, k, v), causal=causal):
                                return torch_api.flash_attention(*args, causal=causal)

                            got = fn()
                            row["max diff"] = f"{(got.float() - want.float()).abs().max().item():.2e}"
                        t = time_per_call(fn, sync, iters=5 if T >= 8192 else 10, reps=3, warmup=2)
                        row["ms"] = f"{t * 1e3:.3f}"
                        row["TFLOP/s"] = f"{_flops(T, D, causal) / t / 1e12:.0f}"
                    except Exception as e:  # one failing candidate must not hide the rest
                        row["ms"] = f"error: {type(e).__name__}: {str(e)[:100]}"
                    print(row, flush=True)
                    rows.append(row)
                flash.set_tma_forward(False)
                torch.cuda.empty_cache()
    return rows


def _ratios(rows):
    base = {(r["D"], r["causal"], r["T"]): r.get("TFLOP/s") for r in rows if r["impl"] == "sdpa cudnn"}
    for r in rows:
        b = base.get((r["D"], r["causal"], r["T"]))
        if b and "TFLOP/s" in r:
            r["vs cudnn"] = f"{float(r['TFLOP/s']) / float(b):.2f}x"


if __name__ == "__main__":
    run([int(a) for a in sys.argv[1:]] or SEQ_LENS)
