"""JAX's side of bench/probes/segment_profile: one jitted forward, causal
B1 32 on 4 heads bf16, plain, with one segment of ids, and the ranges
launch alone (elapsed a call, 50 calls back to back, best of 5), and the
kernels the compiled ids call runs (its HLO's custom calls and fusions).
Offline probe."""

import re
import time

import jax
import jax.numpy as jnp

import jax_api
from jax_api.flash_attention import _ranges


def _elapsed(f, *args, n=50):
    best = float("inf")
    for _ in range(5):
        jax.block_until_ready(f(*args))
        t0 = time.perf_counter()
        for _ in range(n):
            r = f(*args)
        jax.block_until_ready(r)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    for T, D in ((4096, 64), (4096, 128)):
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q = jax.random.normal(keys[0], (1, T, 32, D), jnp.bfloat16)
        k, v = (jax.random.normal(kk, (1, T, 4, D), jnp.bfloat16) for kk in keys[1:])
        ids = jnp.zeros((1, T), jnp.int32)
        plain = jax.jit(lambda q, k, v, ids: jax_api.flash_attention(q, k, v, causal=True))
        seg = jax.jit(lambda q, k, v, ids: jax_api.flash_attention(q, k, v, ids, causal=True))
        ranges = jax.jit(lambda q, k, v, ids: _ranges(ids, ids))
        for name, f in (("plain", plain), ("segment ids", seg), ("ranges alone", ranges)):
            print(f"T={T} D={D} {name}: {_elapsed(f, q, k, v, ids):.1f}us a call", flush=True)
        hlo = seg.lower(q, k, v, ids).compile().as_text()
        calls = re.findall(r'custom_call_target="([^"]+)"', hlo)
        fusions = re.findall(r"^\s*\S+ = \S+ fusion\(", hlo, flags=re.M)
        print(f"  compiled ids call: custom calls {calls}, {len(fusions)} fusions", flush=True)
        for line in hlo.splitlines():
            if " fusion(" in line or "custom-call(" in line or "copy(" in line:
                print("   ", line.strip()[:160])


if __name__ == "__main__":
    main()
