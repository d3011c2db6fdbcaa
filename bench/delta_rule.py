"""The gated delta rule (issue 26): twinkernels (PyTorch and JAX bindings)
beside flash-linear-attention in the same run, bfloat16, HK 16 key heads,
HV 32 value heads, K = V = 128.

Training cases, forward and forward+backward (every input's gradient):
``gdn`` (scalar gate ``g``; fla ``chunk_gated_delta_rule``) and ``kda``
(per-channel gate ``gk``; fla ``chunk_kda``), at B1 T32k packed with 16
documents and B4 T4k, L2-normalised q/k as the models run them.  fla's
backward is reported as refused where it raises (its Hopper guard for
Triton < 3.7.1).

``TWINKERNELS_BENCH_IMPLS`` (comma-separated: ``torch``, ``jax``, ``fla``)
keeps those implementations of the training cases.

Decoding: one token per sequence against a float32 state (B16, B64), ours
in place against fla's ``fused_recurrent_gated_delta_rule``: device time
from CUDA-graph replay, with "bw" the state's bytes read and written once
over that time as a fraction of the copy bandwidth, and back-to-back eager
calls (host time included; the JAX binding's jitted step with the state
donated).
"""

from __future__ import annotations

import os

from bench.common import copy_bandwidth, fla_ratios, graph_time_per_call, markdown_table, save, timed

HK, HV, D = 16, 32, 128
TRAIN = [("gdn", 1, 32768, 16), ("gdn", 4, 4096, 0), ("kda", 1, 32768, 16), ("kda", 4, 4096, 0)]
DECODE = [16, 64]


def count() -> int:
    return len(TRAIN) + len(DECODE)


def _inputs(torch, op, B, T, docs, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*s, dtype=torch.bfloat16):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)

    logsig = torch.nn.functional.logsigmoid
    x = {
        "query": rnd(B, T, HK, D),
        "key": rnd(B, T, HK, D),
        "value": rnd(B, T, HV, D),
        "beta": torch.sigmoid(rnd(B, T, HV, dtype=torch.float32)).to(torch.bfloat16),
    }
    if op == "gdn":
        x["g"] = logsig(rnd(B, T, HV, dtype=torch.float32) + 4)
    else:
        x["gk"] = logsig(rnd(B, T, HV, D, dtype=torch.float32) + 4)
    cu = None
    if docs:
        # Documents of random lengths (at least 64 tokens each).
        cuts = torch.randperm(T // 64 - 1, generator=torch.Generator().manual_seed(seed))[: docs - 1] + 1
        cu = torch.cat([torch.zeros(1), cuts.sort().values * 64.0, torch.full((1,), float(T))])
        cu = cu.to(device="cuda", dtype=torch.int32)
    return x, cu


def _fla(op):
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return lambda x, cu: chunk_gated_delta_rule(
            x["query"], x["key"], x["value"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True, cu_seqlens=cu
        )[0]
    from fla.ops.kda import chunk_kda

    return lambda x, cu: chunk_kda(
        x["query"], x["key"], x["value"], x["gk"], x["beta"], use_qk_l2norm_in_kernel=True, cu_seqlens=cu
    )[0]


def _ours(api):
    return lambda x, cu: api.gated_delta_rule(**x, cu_seqlens=cu, use_qk_l2norm=True, mode="chunk")[0]


def _torch_pair(torch, fn, x, cu):
    leaves = {n: v.clone().requires_grad_(True) for n, v in x.items()}
    do = torch.randn_like(x["value"])

    def fwd():
        with torch.no_grad():
            return fn(x, cu)

    def fwd_bwd():
        return torch.autograd.grad(fn(leaves, cu), list(leaves.values()), do)

    return fwd, fwd_bwd


def _jax_pair(jax, jnp, fn, x, cu):
    xj = {n: jnp.from_dlpack(v) for n, v in x.items()}
    cj = None if cu is None else jnp.from_dlpack(cu)
    do = jnp.ones(xj["value"].shape, jnp.bfloat16) * 0.01
    fwd = jax.jit(lambda d, c: fn(d, c))

    def out_and_grads(d, c):
        out, pull = jax.vjp(lambda p: fn(p, c), d)
        # The output is returned too, so that XLA keeps the forward launches.
        return out, pull(do)

    fwd_bwd = jax.jit(out_and_grads)
    return (lambda: fwd(xj, cj)), (lambda: fwd_bwd(xj, cj))


def _train_rows(torch, jax, jnp, torch_api, jax_api, op, B, T, docs):
    x, cu = _inputs(torch, op, B, T, docs)
    impls = {
        "twinkernels torch": ("torch", _ours(torch_api)),
        "twinkernels jax": ("jax", _ours(jax_api)),
    }
    try:
        impls["fla"] = ("torch", _fla(op))
    except Exception as e:  # fla is optional: say why it is missing
        print(f"fla not benchmarked: {type(e).__name__}: {e}")
    shape = f"B{B} T{T // 1024}k" + (f" {docs} docs" if docs else "")
    # TWINKERNELS_BENCH_IMPLS="fla" times those implementations only: a
    # device call that runs fla's autotuning once, whose results Triton's
    # cache keeps (gpu_run.sh saves it) for a later call's full run.
    keep = [i for i in os.environ.get("TWINKERNELS_BENCH_IMPLS", "").split(",") if i]
    impls = {n: v for n, v in impls.items() if not keep or n in keep or n.split()[-1] in keep}
    rows = []
    for name, (kind, fn) in impls.items():
        if kind == "torch":
            pair = _torch_pair(torch, fn, x, cu)
            sync = lambda _: torch.cuda.synchronize()  # noqa: E731
        else:
            pair = _jax_pair(jax, jnp, fn, x, cu)
            sync = lambda o: jax.block_until_ready(o)  # noqa: E731
        for mode, call in zip(("fwd", "fwd+bwd"), pair, strict=True):
            row = {"op": op, "shape": shape, "impl": name, "mode": mode}
            try:
                row["ms"] = f"{timed(call, sync) * 1e3:.3f}"
            except Exception as e:  # a refused baseline must not hide the rest
                row["ms"] = f"refused: {type(e).__name__}: {str(e)[:80]}"
            print(row, flush=True)
            rows.append(row)
    return rows


def _decode_rows(torch, jax, jnp, torch_api, jax_api, B, bandwidth):
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rnd(*s, dtype=torch.bfloat16):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)

    q, k = rnd(B, 1, HK, D), rnd(B, 1, HK, D)
    v, beta = rnd(B, 1, HV, D), torch.sigmoid(rnd(B, 1, HV))
    g = torch.nn.functional.logsigmoid(rnd(B, 1, HV, dtype=torch.float32) + 4)
    state = rnd(B, HV, D, D, dtype=torch.float32)
    nbytes = 2 * state.numel() * 4  # read and written once
    impls = {
        "twinkernels torch (in place)": lambda: torch_api.gated_delta_rule_step(
            q, k, v, beta, state, g=g, use_qk_l2norm=True
        ),
    }
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        impls["fla fused_recurrent"] = lambda: fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
    except Exception as e:
        print(f"fla not benchmarked: {type(e).__name__}: {e}")
    rows = []
    for name, fn in impls.items():
        row = {"op": "decode", "shape": f"B{B}", "impl": name, "mode": "step"}
        try:
            t = graph_time_per_call(torch, fn)
            row["us"] = f"{t * 1e6:.1f}"
            row["bw"] = f"{nbytes / t / 1e9 / bandwidth:.2f}"
            row["eager us"] = f"{timed(fn, lambda _: torch.cuda.synchronize()) * 1e6:.1f}"
        except Exception as e:
            row["us"] = f"error: {type(e).__name__}: {str(e)[:80]}"
        print(row, flush=True)
        rows.append(row)
    # JAX: no CUDA-graph capture of its calls here; the jitted step with the
    # state donated, back to back (host time included).
    args = {
        n: jnp.from_dlpack(t) for n, t in {"query": q, "key": k, "value": v, "beta": beta, "g": g}.items()
    }
    step = jax.jit(
        lambda a, s: jax_api.gated_delta_rule_step(**a, state=s, use_qk_l2norm=True), donate_argnums=1
    )
    carried = [jnp.from_dlpack(state.clone())]

    def jax_step():
        out, carried[0] = step(args, carried[0])
        return out

    row = {"op": "decode", "shape": f"B{B}", "impl": "twinkernels jax (donated)", "mode": "step"}
    row["eager us"] = f"{timed(jax_step, lambda o: jax.block_until_ready(o)) * 1e6:.1f}"
    print(row, flush=True)
    rows.append(row)
    return rows


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api

    only = [o for o in os.environ.get("TWINKERNELS_BENCH_ONLY", "").split(",") if o]
    rows = []
    for op, B, T, docs in TRAIN:
        # ("kda" picks every KDA case, "kda-B4" the B4 one.)
        if not only or op in only or f"{op}-B{B}" in only:
            rows += _train_rows(torch, jax, jnp, torch_api, jax_api, op, B, T, docs)
        if progress is not None:
            progress.update(1)
    fla_ratios(rows, ("op", "shape", "mode"))
    decode = []
    bandwidth = copy_bandwidth(torch)
    for B in DECODE if not only or "decode" in only else ():
        decode += _decode_rows(torch, jax, jnp, torch_api, jax_api, B, bandwidth)
        if progress is not None:
            progress.update(1)
    meta = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "copy GB/s": f"{bandwidth:.0f}"}
    save("delta_rule", rows + decode, meta)
    print(markdown_table(rows, ["op", "shape", "mode", "impl", "ms", "vs fla", "jax/torch"]))
    print(markdown_table(decode, ["op", "shape", "impl", "us", "bw", "eager us"]))
    return rows
