"""What would dQ cost inside the dK/dV kernel (issue 31)?

The backward now runs dQ as a launch of its own, which recomputes the
probabilities and ``dP``: 3 matrix products a tile pair beside dK/dV's 4,
where FlashAttention-2/3 and cuDNN make 5 (dQ added up across key blocks,
by atomics).  This probe times a plain causal grouped-query dK/dV kernel
(every block masked, no options) at the Llama shape three ways: as is, with
``dQ^T = K^T dS^T`` (``[D, BM]``: no product's result is transposed, which
Triton 3.4-3.7 miscompile on Hopper) added into a float32 ``[B, HQ, D,
T]`` buffer by ``tl.atomic_add``, and by a tensor descriptor's
``atomic_add`` (TMA's bulk reduction).  The difference is what fusing dQ
would add to the dK/dV launch; beside it, the real backward's kernels
under the profiler (our dQ launch is what fusing would remove).

``python -m bench.probes.dq_fused``; prints a table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot

LOG2E = 1.4426950408889634
B, T, HQ, H, D = 1, 4096, 32, 4, 64
DEVICE = "cuda"


@triton.jit
def _probe_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, T, dq_rows, scale,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    SPLITS: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid = tl.program_id(1)
    split = pid % SPLITS
    bh = pid // SPLITS
    b = bh // H
    h = bh % H
    group: tl.constexpr = HQ // H
    per: tl.constexpr = group // SPLITS
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + ((b * T + offs_n[:, None]) * H + h) * D + offs_d[None, :])
    v = tl.load(V + ((b * T + offs_n[:, None]) * H + h) * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    if FUSED == 2:
        desc = tl.make_tensor_descriptor(DQ, shape=[dq_rows, T], strides=[T, 1], block_shape=[D, BM])
    for g in range(split * per, split * per + per):
        hq = h * group + g
        lo = (pid_n * BN // BM) * BM
        for start in range(lo, T, BM):
            offs_m = start + tl.arange(0, BM)
            q = tl.load(Q + ((b * T + offs_m[:, None]) * HQ + hq) * D + offs_d[None, :])
            do = tl.load(DO + ((b * T + offs_m[:, None]) * HQ + hq) * D + offs_d[None, :])
            lse = tl.load(LSE + (b * HQ + hq) * T + offs_m) * 1.4426950408889634
            delta = tl.load(DELTA + (b * HQ + hq) * T + offs_m)
            s_t = dot(k, tl.trans(q), None) * qk_scale
            p_t = tl.exp2(s_t - lse[None, :])
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
            dv += dot(p_t.to(do.dtype), do, None)
            dp_t = dot(v, tl.trans(do), None)
            ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
            dk += dot(ds_t, q, None)
            if FUSED != 0:
                dq_t = dot(tl.trans(k), ds_t, None) * scale  # [D, BM]
                if FUSED == 1:
                    ptrs = DQ + ((b * HQ + hq) * D + offs_d[:, None]) * T + offs_m[None, :]
                    tl.atomic_add(ptrs, dq_t, sem="relaxed")
                else:
                    desc.atomic_add([(b * HQ + hq) * D, start], dq_t)
    out = ((split * tl.num_programs(1) // SPLITS + bh) * T + offs_n[:, None]) * D + offs_d[None, :]
    tl.store(DK + out, dk * scale)
    tl.store(DV + out, dv)


def _inputs():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q = torch.randn(B, T, HQ, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    do = torch.randn(B, T, HQ, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    return q, k, v, do


def _reference(q, k, v, do, scale):
    """``(lse [B, HQ, T], delta, dq [B, T, HQ, D])`` in float32 (causal)."""
    rep = HQ // H
    qf, kf, vf, dof = (t.float().transpose(1, 2) for t in (q, k, v, do))
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    qf.requires_grad_(True)
    s = qf @ kf.transpose(-1, -2) * scale
    s = s.masked_fill(torch.ones(T, T, device=DEVICE, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ vf
    (dq,) = torch.autograd.grad(o, qf, dof)
    delta = (o * dof).sum(-1)
    return lse.detach(), delta.detach(), dq.transpose(1, 2)


def _profile_ours(q, k, v, do):
    """Our backward's kernels at this shape: device us per call, by name."""
    import torch_api

    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def step():
        out = torch_api.flash_attention(*leaves, causal=True)
        torch.autograd.grad(out, leaves, do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.key[:60]] = e.device_time_total / 10
    return times


def main():
    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=DEVICE))
    q, k, v, do = _inputs()
    scale = D**-0.5
    lse, delta, dq_ref = _reference(q, k, v, do, scale)
    rows = []
    for bm, bn, warps, stages in ((32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3)):
        for splits in (8, 2):
            base = None
            for fused in (0, 1, 2):
                dk = torch.empty(splits, B * H, T, D, device=DEVICE, dtype=torch.float32)
                dv = torch.empty_like(dk)
                dq = torch.zeros(B, HQ, D, T, device=DEVICE, dtype=torch.float32)
                grid = (T // bn, B * H * splits)

                def launch(
                    dq=dq, dk=dk, dv=dv, fused=fused, grid=grid, tiles=(bm, bn, splits, warps, stages)
                ):
                    bm_, bn_, splits_, w, s = tiles
                    args = (q, k, v, do, lse, delta, dk, dv, dq, T, B * HQ * D, scale, HQ, H, D)
                    _probe_dkdv[grid](*args, bm_, bn_, splits_, fused, num_warps=w, num_stages=s)

                try:
                    launch()
                    torch.cuda.synchronize()
                    err = ""
                    if fused:
                        got = dq.permute(0, 3, 1, 2)
                        err = f"{((got - dq_ref).abs().max() / dq_ref.abs().max()).item():.1e}"
                    us = triton.testing.do_bench(launch, warmup=25, rep=200) * 1e3
                    zero_us = triton.testing.do_bench(dq.zero_, warmup=10, rep=50) * 1e3 if fused else 0.0
                except Exception as e:  # a variant Triton 3.6 refuses must not hide the others
                    rows.append(
                        (bm, bn, warps, stages, splits, fused, f"error {type(e).__name__}: {e}"[:160])
                    )
                    continue
                base = us if fused == 0 else base
                extra = "" if base is None or fused == 0 else f"+{us - base:.1f}"
                rows.append(
                    (
                        bm,
                        bn,
                        warps,
                        stages,
                        splits,
                        fused,
                        f"{us:.1f} us {extra} zero {zero_us:.1f} err {err}",
                    )
                )
                print(rows[-1], flush=True)
    print("| BM | BN | warps | stages | splits | dQ (0 none, 1 atomics, 2 TMA reduce) | device us |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    for name, us in sorted(_profile_ours(q, k, v, do).items(), key=lambda kv: -kv[1]):
        print(f"ours: {us:8.1f} us  {name}")


if __name__ == "__main__":
    main()
