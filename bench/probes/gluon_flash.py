"""The Gluon flash forward (core_triton.attention.flash_fwd_gluon) beside
the plan's forward and cuDNN, on the GPU (issue 31).  Not part of ``nox -s
bench``.

First every correctness shape: the kernel's ``out`` and ``lse`` against a
float32 PyTorch reference (outputs filled with NaN first), ragged lengths,
grouped heads, causal with ``Tq != Tk``, several batches whose rows past
``T`` must not be read; then forward times at issue 31's shapes: the Gluon
kernel, ``torch_api.flash_attention`` (the plan's kernels) and SDPA on
cuDNN, one after another in each of three rounds (medians).

``python -m bench.probes.gluon_flash``; ``GLUON_FLASH_TIME=0`` checks only;
``GLUON_FLASH_MODULES=core,mod,...``: the kernels to take, ``core`` the
library's (``core-pingpong`` the same with ``PINGPONG``) and any other a
module holding a ``flash_fwd_gluon_kernel`` of the same parameters (an
older copy, with or without ``QRANGE``/``GATE``), each checked and timed
beside the others; ``mod:NAME=value:...`` sets constexprs of its own
(``STAGES`` among them).  A module whose name ends in ``persistent`` is
launched one program an SM.
"""

from __future__ import annotations

import importlib
import math
import os
import statistics

import torch
import triton

from core_triton.attention import flash_fwd_gluon
from torch_api._launch import _ensure_scratch_allocator

CHECKS = (
    # (B, Tq, Tk, HQ, H, D, causal)
    (1, 128, 128, 1, 1, 128, False),
    (1, 128, 128, 1, 1, 128, True),
    (2, 1000, 1000, 4, 4, 128, True),
    (2, 1000, 1000, 4, 4, 128, False),
    (3, 300, 1000, 8, 2, 128, True),
    (3, 1000, 300, 8, 2, 128, True),
    (2, 777, 513, 4, 1, 128, False),
    (1, 1, 1, 2, 2, 128, True),
    (2, 4096, 4096, 4, 4, 128, True),
    (2, 1000, 1000, 4, 4, 64, True),
    (2, 2048, 2048, 4, 4, 64, False),
    (2, 777, 513, 4, 1, 64, False),
    (3, 300, 1000, 8, 2, 64, False),
    (1, 1, 1, 2, 2, 64, False),
)
SHAPES = (
    (4, 8192, 8192, 16, 16, 128, False),
    (4, 8192, 8192, 16, 16, 128, True),
    (8, 4096, 4096, 16, 16, 128, False),
    (8, 4096, 4096, 16, 16, 128, True),
    (16, 2048, 2048, 16, 16, 128, False),
    (16, 2048, 2048, 16, 16, 128, True),
    (32, 1024, 1024, 16, 16, 128, False),
    (32, 1024, 1024, 16, 16, 128, True),
    (4, 8192, 8192, 16, 16, 64, False),
    (4, 8192, 8192, 16, 16, 64, True),
    (8, 4096, 4096, 16, 16, 64, False),
    (16, 2048, 2048, 16, 16, 64, False),
    (16, 2048, 2048, 16, 16, 64, True),
    (1, 4096, 4096, 32, 4, 64, True),
    (1, 4096, 4096, 32, 4, 128, True),
)
STAGES, MAXNREG = 3, 168  # 176 leaves too few registers for 384 threads
MODULES = os.environ.get("GLUON_FLASH_MODULES", "core").split(",")
# Substrings of the rows to run ("D64 full,T8192"), every row without it.
ONLY = [s for s in os.environ.get("GLUON_FLASH_ONLY", "").split(",") if s]


def _label(B, Tq, Tk, HQ, H, D, causal):
    return f"B{B} T{Tq} H{HQ}/{H} D{D} {'causal' if causal else 'full'}"


def _wanted(label):
    return not ONLY or any(s in label for s in ONLY)


def _takes(extra, D, causal):
    """Whether a variant applies: three consumer groups (``GROUPS`` 3) take
    head dim 64 without a causal mask only."""
    return (extra or {}).get("GROUPS", 2) != 3 or (D == 64 and not causal)


def _kernel(name):
    """``(kernel, extra constexprs)`` of a ``GLUON_FLASH_MODULES`` entry."""
    if name in ("core", "core-pingpong"):
        return flash_fwd_gluon.flash_fwd_gluon_kernel, {"PINGPONG": name == "core-pingpong"}
    module, *sets = name.split(":")
    kernel = importlib.import_module(module).flash_fwd_gluon_kernel
    kernel.probe_persistent = module.endswith("persistent")
    return kernel, {k: int(v) for k, v in (a.split("=") for a in sets)}


VARIANTS = tuple((name, *_kernel(name)) for name in MODULES)


def gluon_forward(q, k, v, causal, kernel, extra=None, outputs=None):
    """``(out, lse)`` of ``kernel``, into ``outputs`` if given (timing: no
    allocation or fill timed), else into new arrays filled with NaN."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    out, lse = outputs or (
        torch.full_like(q, float("nan")),
        torch.full((B, HQ, Tq), float("nan"), device=q.device, dtype=torch.float32),
    )
    consts = {"STAGES": STAGES, "BM": 128, "BN": 128, **(extra or {})}
    # Three consumer groups (the persistent kernel's GROUPS 3) run 16 warps.
    maxnreg = 128 if consts.get("GROUPS", 2) == 3 else MAXNREG
    grid = (triton.cdiv(Tq, consts["BM"]), B * HQ)
    if getattr(kernel, "probe_persistent", False):
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        grid = (min(grid[0] * grid[1], sms),)
    gate = ("QRANGE" in kernel.arg_names) * (q,)
    # The persistent kernel's ids and their batch strides (unused: not RANGED).
    gate += ("QSEG" in kernel.arg_names) * (q, q, 0, 0)
    gate_flag = {"GATE": 0} if gate else {}
    kernel[grid](
        q, k, v, *gate, 1.0 / math.sqrt(D), B, Tq, Tk, out, lse,
        HQ=HQ, H=H, D=D, CAUSAL=causal, **gate_flag, **consts,
        num_warps=4, maxnreg=maxnreg,
    )  # fmt: skip
    return out, lse


def reference(q, k, v, causal):
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = s.shape[-2:]
        keep = torch.arange(Tk, device=s.device)[None, :] <= torch.arange(Tq, device=s.device)[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ v).transpose(1, 2), lse


def inputs(B, Tq, Tk, HQ, H, D, dtype=torch.bfloat16, poison_tail=False):
    g = torch.Generator(device="cuda").manual_seed(B * 1000 + Tq + Tk + D)
    q = torch.randn(B, Tq, HQ, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Tk, H, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Tk, H, D, device="cuda", generator=g).to(dtype)
    return q, k, v


def check():
    print("| B Tq Tk HQ H D causal | variant | out err / scale | lse max err | NaN |")
    print("|---|---|---|---|---|")
    failed = 0
    for B, Tq, Tk, HQ, H, D, causal in CHECKS:
        if not _wanted(_label(B, Tq, Tk, HQ, H, D, causal)):
            continue
        q, k, v = inputs(B, Tq, Tk, HQ, H, D)
        ref_out, ref_lse = reference(q, k, v, causal)
        for name, kernel, extra in VARIANTS:
            if not _takes(extra, D, causal):
                continue
            try:
                out, lse = gluon_forward(q, k, v, causal, kernel, extra)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                row = f"{B} {Tq} {Tk} {HQ} {H} {D} {causal}"
                print(f"| {row} | {name} | {type(exc).__name__}: {exc} | | |")
                failed += 1
                continue
            nan = bool(out.isnan().any() or lse.isnan().any())
            err = ((out.float() - ref_out).abs().max() / ref_out.abs().max()).item()
            lerr = (lse.transpose(1, 2) - ref_lse.transpose(1, 2)).abs().max().item()
            bad = nan or err > 2e-2 or lerr > 1e-3
            failed += bad
            flag = " **FAIL**" if bad else ""
            row = f"{B} {Tq} {Tk} {HQ} {H} {D} {causal}"
            print(f"| {row} | {name} | {err:.2e}{flag} | {lerr:.2e} | {nan} |")
    # Batch 1 holds infinities and NaN: batch 0 must not see them.
    for D in (128, 64):
        if not _wanted(_label(2, 1000, 1000, 2, 2, D, False)):
            continue
        q, k, v = inputs(2, 1000, 1000, 2, 2, D)
        k[1], v[1] = float("inf"), float("nan")
        ref_out, _ = reference(q[:1], k[:1], v[:1], False)
        for name, kernel, extra in VARIANTS:
            if not _takes(extra, D, False):
                continue
            try:
                out, lse = gluon_forward(q, k, v, False, kernel, extra)
            except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                print(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
                failed += 1
                continue
            clean = bool(torch.isfinite(out[0]).all())
            clean = clean and ((out[:1].float() - ref_out).abs().max() < 2e-2).item()
            print(f"{name} D{D}: batch 0 untouched by batch 1's inf/NaN: {clean}")
            failed += not clean
    return failed


def _time(fn, reps=20):
    return triton.testing.do_bench(fn, warmup=25, rep=reps * 10) * 1000


def _not_taken():
    raise ValueError("the variant does not take this shape")


def _time_or_nan(fn):
    """_time, or NaN where the variant does not compile at the shape (a
    variant's shared memory may not fit at the larger head dim)."""
    try:
        return _time(fn)
    except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
        print(f"  ({type(exc).__name__}: {str(exc)[:120]})")
        return float("nan")


def timing():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch_api import flash_attention

    names = " | ".join(name for name, *_ in VARIANTS)
    print(f"| shape | {names} | ours (plan) | SDPA cuDNN | best Gluon / cuDNN | plan / cuDNN |")
    print("|---|" + "---|" * (len(VARIANTS) + 4))
    for B, Tq, Tk, HQ, H, D, causal in SHAPES:
        if not _wanted(_label(B, Tq, Tk, HQ, H, D, causal)):
            continue
        q, k, v = inputs(B, Tq, Tk, HQ, H, D)
        qkv = (q, k, v)
        qkv_t = tuple(x.transpose(1, 2) for x in qkv)
        outputs = (torch.empty_like(q), torch.empty(B, HQ, Tq, device=q.device, dtype=torch.float32))
        fns = [
            (lambda k=kern, e=extra, a=qkv, m=causal, o=outputs: gluon_forward(*a, m, k, e, o))
            if _takes(extra, D, causal)
            else _not_taken
            for _, kern, extra in VARIANTS
        ]
        fns.append(lambda a=qkv, m=causal: flash_attention(*a, causal=m))

        def cudnn(a=qkv_t, m=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(*a, is_causal=m)

        fns.append(cudnn)
        rounds = [[_time_or_nan(f) for f in fns] for _ in range(3)]
        med = [statistics.median(r[i] for r in rounds) for i in range(len(fns))]
        flops = 4 * B * HQ * Tq * Tk * D / (2 if causal else 1)
        tf = [flops / (t * 1e-6) / 1e12 for t in med]
        cells = " | ".join(f"{t:.1f} us ({f:.0f})" for t, f in zip(med, tf, strict=True))
        best = min((t for t in med[: len(VARIANTS)] if t == t), default=float("nan"))
        print(f"| {_label(B, Tq, Tk, HQ, H, D, causal)} | {cells} | "
              f"{med[-1] / best:.2f} | {med[-1] / med[-2]:.2f} |")  # fmt: skip


def main():
    _ensure_scratch_allocator()  # the descriptors live in global scratch
    failed = check() if os.environ.get("GLUON_FLASH_CHECK", "1") != "0" else 0
    print(f"checks failed: {failed}")
    if os.environ.get("GLUON_FLASH_TIME", "1") != "0":
        timing()


if __name__ == "__main__":
    main()
