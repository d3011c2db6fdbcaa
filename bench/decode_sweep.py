"""A tuning aid (not part of ``nox -s bench``): the decode split kernel's
(BN, num_warps, num_stages) candidates on a few cases of bench/decode.py,
beside SDPA cuDNN, and the JAX binding with the chosen config.
``python -m bench.decode_sweep``."""

from __future__ import annotations

import sys

from bench.common import time_per_call

CASES = ((1, 4096), (1, 16384), (1, 65536), (1, 131072), (16, 4096), (16, 65536), (64, 16384))
CONFIGS = ((64, 4, 2), (128, 4, 3))
# Programs the split count aims for (decode._TARGET_PROGRAMS), with each config.
TARGETS = (66, 132, 264)


def main(argv):
    import jax
    import jax.numpy as jnp
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import jax_api
    import torch_api
    from core_triton.attention import decode

    for B, S in CASES:
        _case(B, S, torch, jax, jnp, torch_api, jax_api, decode, SDPBackend, sdpa_kernel)


def _case(B, S, torch, jax, jnp, torch_api, jax_api, decode, SDPBackend, sdpa_kernel):
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

    line = [f"B{B} S{S}: cudnn {time_per_call(cudnn, sync, iters=20) * 1e6:.1f}"]
    for target in TARGETS:
        decode._TARGET_PROGRAMS = target
        for config in CONFIGS:
            decode.set_config(config)
            t = time_per_call(lambda: torch_api.decode_attention(q, k, v, lens), sync, iters=20)
            line.append(f"{target}/{config} {t * 1e6:.1f}")
    decode._TARGET_PROGRAMS = 264
    decode.set_config((128, 8, 3))
    jq, jk, jv, jl = (jnp.from_dlpack(t) for t in (q, k, v, lens))
    f = jax.jit(jax_api.decode_attention)
    t = time_per_call(lambda: f(jq, jk, jv, jl), jax.block_until_ready, iters=20)
    line.append(f"jax {t * 1e6:.1f}")
    print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
