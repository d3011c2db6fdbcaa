# ruff: noqa: E501  (the timed script is a string, kept readable as written)
"""Before/after: the same kernel-bound cases timed on two source trees in
one session, alternating fresh processes (before, after, before, after) so
that clock drift hits both alike.  ``python -m bench.probes.compare_trees
OLD_TREE [NEW_TREE]`` (NEW_TREE defaults to this checkout); an extracted
``git archive`` of the old commit is a tree.

Cases (bfloat16, public API only, so any version of the library runs
them): flash attention B4 H16 D128, T 2k and 8k, causal and not, forward
and forward+backward, both bindings; ``chunk_linear_attn`` with ``g`` and
``lightning_attn`` at B4 T4096 H16 K=V=128, forward+backward, PyTorch.
With ``COMPARE_CASES=latency``: eager PyTorch forward+backward at B2 T512
H8 D64 (flash causal, chunk with ``g``, lightning), host-bound, in us per
call, with SDPA's in each process as the host's yardstick.  With
``COMPARE_CASES=linear``: ``chunk_linear_attn`` with ``g`` and lightning,
forward and forward+backward, at B4 T4096 and B1 T32768 (H16, K = V = 128,
bf16), PyTorch, in ms.  With ``COMPARE_CASES=llama``: flash at a Llama 1B
layer's heads (B1 T4k, 32 query heads on 4, D64, causal) forward+backward,
plain, one segment of ids, 4 documents by ids and by ``cu_seqlens``, both
bindings, in ms; and the host-bound eager call at T256 in us.
"""

from __future__ import annotations

import os
import subprocess
import sys

_CASES = r"""
import os, sys, time, statistics
import torch
import jax, jax.numpy as jnp
import torch_api, jax_api
print("RESULT imported from", torch_api.__file__.rsplit("/", 2)[0], "-")

def timed(fn, sync, iters, reps=5):
    for _ in range(3):
        sync(fn())
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            r = fn()
        sync(r)
        out.append((time.perf_counter() - t) / iters)
    return statistics.median(out)

tsync = lambda _: torch.cuda.synchronize()
jsync = lambda r: jax.block_until_ready(r)
B, H, D = 4, 16, 128
for T in (2048, 8192):
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    jq, jk, jv, jdo = (jnp.from_dlpack(x) for x in (q, k, v, do))
    for causal in (False, True):
        flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        cases = {
            "torch fwd": (lambda: torch_api.flash_attention(q, k, v, causal=causal), tsync, 1.0),
            "torch fwd+bwd": (lambda: torch.autograd.grad(torch_api.flash_attention(*leaves, causal=causal), leaves, do), tsync, 3.5),
        }
        f = jax.jit(lambda a, b, c: jax_api.flash_attention(a, b, c, causal=causal))
        vjp = jax.jit(lambda a, b, c, d: jax.vjp(lambda *x: jax_api.flash_attention(*x, causal=causal), a, b, c)[1](d))
        cases["jax fwd"] = (lambda: f(jq, jk, jv), jsync, 1.0)
        cases["jax fwd+bwd"] = (lambda: vjp(jq, jk, jv, jdo), jsync, 3.5)
        for name, (fn, sync, mult) in cases.items():
            t = timed(fn, sync, iters=10 if T == 2048 else 4)
            print(f"RESULT flash T={T} causal={causal} {name} {flops * mult / t / 1e12:.1f} TFLOP/s", flush=True)
Bl, Tl, Hl, Kl = 4, 4096, 16, 128
x = [torch.randn(Bl, Tl, Hl, Kl, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
g = (-torch.rand(Bl, Tl, Hl, device="cuda")).requires_grad_(True)
do = torch.randn_like(x[2])
for name, fn in (
    ("chunk g fwd+bwd", lambda: torch.autograd.grad(torch_api.chunk_linear_attn(*x, g=g)[0], [*x, g], do)),
    ("lightning fwd+bwd", lambda: torch.autograd.grad(torch_api.lightning_attn(*x, layer_idx=2, num_layers=8)[0], x, do)),
):
    print(f"RESULT linear {name} {timed(fn, tsync, iters=10) * 1e3:.3f} ms", flush=True)
"""

# Put before _LINEAR and _LATENCY: imports, where torch_api came from, and
# the timer (median over ``reps`` of ``iters`` calls, after ``warmup``).
_TORCH_PRELUDE = r"""
import time, statistics
import torch
import torch_api
print("RESULT imported from", torch_api.__file__.rsplit("/", 2)[0], "-")

def timed(fn, iters, reps, warmup, sync=lambda _: torch.cuda.synchronize()):
    for _ in range(warmup):
        sync(fn())
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            r = fn()
        sync(r)
        out.append((time.perf_counter() - t) / iters)
    return statistics.median(out)
"""

_LINEAR = r"""

H, K = 16, 128
for B, T in ((4, 4096), (1, 32768)):
    x = [torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    g = (-torch.nn.functional.softplus(torch.randn(B, T, H, device="cuda"))).requires_grad_(True)
    do = torch.randn_like(x[2])
    chunk = lambda: torch_api.chunk_linear_attn(*x, g=g)[0]
    light = lambda: torch_api.lightning_attn(*x, layer_idx=2, num_layers=8)[0]
    for name, fn in (
        ("chunk g fwd", lambda: chunk().detach()),
        ("chunk g fwd+bwd", lambda: torch.autograd.grad(chunk(), [*x, g], do)),
        ("lightning fwd", lambda: light().detach()),
        ("lightning fwd+bwd", lambda: torch.autograd.grad(light(), x, do)),
    ):
        print(f"RESULT linear B{B} T{T} {name} {timed(fn, 10, 5, 3) * 1e3:.3f} ms", flush=True)
"""

_LLAMA = r"""
import jax, jax.numpy as jnp
import jax_api

T, HQ, H, D = 4096, 32, 4, 64
q, do = (torch.randn(1, T, HQ, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
jx = [jnp.from_dlpack(x) for x in (q, k, v, do)]
one = torch.zeros(1, T, dtype=torch.int32, device="cuda")
docs = torch.arange(T, device="cuda", dtype=torch.int32)[None] // (T // 4)
cu = torch.arange(0, T + 1, T // 4, device="cuda", dtype=torch.int32)
for name, kw in (("plain", {}), ("one segment", {"q_segment_ids": one}), ("4 docs ids", {"q_segment_ids": docs}),
                 ("4 docs cu_seqlens", {"cu_seqlens": cu})):
    tfn = lambda kw=kw: torch.autograd.grad(torch_api.flash_attention(*leaves, causal=True, **kw), leaves, do)
    jkw = {n: jnp.from_dlpack(t) for n, t in kw.items()}
    jfn = jax.jit(lambda a, b, c, d, kw: jax.vjp(lambda *x: jax_api.flash_attention(*x, causal=True, **kw), a, b, c)[1](d))
    print(f"RESULT llama {name} torch fwd+bwd {timed(tfn, 20, 5, 3) * 1e3:.3f} ms", flush=True)
    jt = timed(lambda: jfn(*jx, jkw), 20, 5, 3, sync=jax.block_until_ready)
    print(f"RESULT llama {name} jax fwd+bwd {jt * 1e3:.3f} ms", flush=True)
lq = torch.randn(1, 256, HQ, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
lk, lv = (torch.randn(1, 256, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
ldo, lone = torch.randn_like(lq), torch.zeros(1, 256, dtype=torch.int32, device="cuda")
for name, kw in (("plain", {}), ("one segment", {"q_segment_ids": lone})):
    fn = lambda kw=kw: torch.autograd.grad(torch_api.flash_attention(lq, lk, lv, causal=True, **kw), [lq, lk, lv], ldo)
    print(f"RESULT latency llama heads T256 {name} fwd+bwd {timed(fn, 50, 7, 5) * 1e6:.1f} us", flush=True)
"""

_LATENCY = r"""

x = [torch.randn(2, 512, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
g = (-torch.nn.functional.softplus(torch.randn(2, 512, 8, device="cuda"))).requires_grad_(True)
do = torch.randn_like(x[0])
def sdpa():
    q, k, v = (t.transpose(1, 2) for t in x)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    return torch.autograd.grad(out, x, do)
for name, fn in (
    ("sdpa causal", sdpa),
    ("flash causal", lambda: torch.autograd.grad(torch_api.flash_attention(*x, causal=True), x, do)),
    ("chunk g", lambda: torch.autograd.grad(torch_api.chunk_linear_attn(*x, g=g)[0], [*x, g], do)),
    ("lightning", lambda: torch.autograd.grad(torch_api.lightning_attn(*x, layer_idx=2, num_layers=8)[0], x, do)),
):
    print(f"RESULT latency {name} fwd+bwd {timed(fn, 50, 7, 5) * 1e6:.1f} us", flush=True)
"""


def _run(tree: str) -> dict[str, str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(tree), os.environ.get("PYTHONPATH", "")])
    )
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    chosen = {"latency": _LATENCY, "linear": _LINEAR, "llama": _LLAMA}.get(
        os.environ.get("COMPARE_CASES", "")
    )
    cases = _CASES if chosen is None else _TORCH_PRELUDE + chosen
    # cwd: ``python -c`` puts the working directory first on sys.path, so
    # run from the tree (from the checkout, both runs imported its code).
    proc = subprocess.run(
        [sys.executable, "-c", cases], env=env, capture_output=True, text=True, timeout=600, cwd=tree
    )
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            key, value = line[7:].rsplit(" ", 2)[0], " ".join(line.rsplit(" ", 2)[1:])
            out[key] = value
    return out


def main(argv):
    old = argv[0]
    new = (
        argv[1]
        if len(argv) > 1
        else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    rounds = int(os.environ.get("COMPARE_ROUNDS", "2"))
    runs = {"before": [], "after": []}
    for _ in range(rounds):
        runs["before"].append(_run(old))
        runs["after"].append(_run(new))
    keys = list(dict.fromkeys(k for r in runs["before"] + runs["after"] for k in r))
    print("| case | " + " | ".join(f"{w} {i + 1}" for w in runs for i in range(rounds)) + " |")
    print("|---|" + "---|" * (2 * rounds))
    for k in keys:
        cells = [r.get(k, "-") for w in runs for r in runs[w]]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
