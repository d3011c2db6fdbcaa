"""First-call time (compiling every kernel of the call, with an empty
Triton cache) of flash attention and ``chunk_linear_attn``, forward and
backward, in both bindings: each case runs in a fresh process with a fresh
``TRITON_CACHE_DIR``.  B=2, T=1024, H=8, D=128, bfloat16.
``python -m bench first_call``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from bench.common import markdown_table, save

_SCRIPT = r"""
import sys, time
fw, op = sys.argv[1], sys.argv[2]
B, T, H, D = 2, 1024, 8, 128
if fw == "torch":
    import torch, torch_api as api
    x = [torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    g = -torch.rand(B, T, H, device="cuda")
    def call():
        if op == "flash":
            out = api.flash_attention(*x, causal=True)
        else:
            out = api.chunk_linear_attn(*x, g=g)[0]
        out.float().square().sum().backward()
        torch.cuda.synchronize()
else:
    import jax, jax.numpy as jnp, jax_api as api
    x = [jnp.asarray(jax.random.normal(jax.random.PRNGKey(i), (B, T, H, D)), jnp.bfloat16) for i in range(3)]
    g = -jax.random.uniform(jax.random.PRNGKey(9), (B, T, H))
    def loss(q, k, v):
        if op == "flash":
            out = api.flash_attention(q, k, v, causal=True)
        else:
            out = api.chunk_linear_attn(q, k, v, g=g)[0]
        return jnp.sum(jnp.square(out.astype(jnp.float32)))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    def call():
        jax.block_until_ready(grad(*x))
start = time.perf_counter()
call()
first = time.perf_counter() - start
start = time.perf_counter()
call()
print(f"RESULT {first:.2f} {time.perf_counter() - start:.4f}")
"""


def run(progress=None) -> list[dict]:
    rows = []
    for fw in ("torch", "jax"):
        for op in ("flash", "chunk"):
            row = {"framework": fw, "op": f"{op} fwd+bwd"}
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TRITON_CACHE_DIR=cache)
                proc = subprocess.run(
                    [sys.executable, "-c", _SCRIPT, fw, op],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
            if lines:
                first, second = lines[-1].split()[1:]
                row["first call s"], row["second call s"] = first, second
            else:
                row["first call s"] = f"error: {proc.stderr.strip().splitlines()[-1:]}"
            rows.append(row)
            print(row, flush=True)
            if progress is not None:
                progress.update(1)
    save("first_call", rows, {"B": 2, "T": 1024, "H": 8, "D": 128, "dtype": "bfloat16"})
    print(markdown_table(rows, ["framework", "op", "first call s", "second call s"]))
    return rows


def count() -> int:
    return 4
