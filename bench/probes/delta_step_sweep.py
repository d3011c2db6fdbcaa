"""A tuning aid (not part of ``nox -s bench``): the gated delta rule's
decoding step (``gated_delta_rule_step``, bench/delta_rule.py's decode
cases: one token, HK 16, HV 32, K = V = 128, float32 state, L2-normalised
q/k) with the normalisation in the kernel or in its own launches, and with
other value tiles and warp counts, device time from CUDA-graph replay and
"bw", the state's bytes read and written once over that time as a fraction
of the copy bandwidth.  ``python -m bench.probes.delta_step_sweep``."""

from __future__ import annotations

from bench.common import copy_bandwidth, graph_time_per_call

HK, HV, D = 16, 32, 128
# (BV, num_warps); None: the planned default.
TILES = (None, (16, 1), (16, 2), (32, 2), (32, 4), (64, 4), (64, 8), (128, 8))


def main():
    import torch

    import torch_api
    from core_triton.delta_rule import recurrent, step

    default_tiles, default_warps = recurrent.tiles, step._warps
    bandwidth = copy_bandwidth(torch)
    print(f"copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    for B in (16, 64):
        gen = torch.Generator(device="cuda").manual_seed(1)

        def rnd(*s, dtype=torch.bfloat16, gen=gen):
            return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)

        q, k = rnd(B, 1, HK, D), rnd(B, 1, HK, D)
        v, beta = rnd(B, 1, HV, D), torch.sigmoid(rnd(B, 1, HV))
        g = torch.nn.functional.logsigmoid(rnd(B, 1, HV, dtype=torch.float32) + 4)
        state = rnd(B, HV, D, D, dtype=torch.float32)
        nbytes = 2 * state.numel() * 4
        line = [f"B{B}"]
        for l2 in (True, False):
            for tile in TILES:
                recurrent.L2_IN_KERNEL = l2
                if tile is None:
                    recurrent.tiles, step._warps = default_tiles, default_warps
                else:
                    bv, warps = tile
                    recurrent.tiles = lambda K, V, heads, bv=bv: (max(16, K), bv)
                    step._warps = lambda bk, bv_, warps=warps: warps
                step._make.cache_clear()

                def fn(q=q, k=k, v=v, beta=beta, state=state, g=g):
                    return torch_api.gated_delta_rule_step(q, k, v, beta, state, g=g, use_qk_l2norm=True)

                t = graph_time_per_call(torch, fn)
                line.append(f"l2 {'in' if l2 else 'apart'} {tile or 'default'}: {t * 1e6:.1f} us "
                            f"({nbytes / t / 1e9 / bandwidth:.2f})")  # fmt: skip
        recurrent.tiles, step._warps, recurrent.L2_IN_KERNEL = default_tiles, default_warps, True
        step._make.cache_clear()
        print("\n  ".join(line), flush=True)


if __name__ == "__main__":
    main()
