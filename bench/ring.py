"""Ring attention on several GPUs against one GPU: causal in the zig-zag
layout, and full (no mask) in the contiguous one, bf16, T_local tokens per
GPU (default 32k), forward+backward.

    torchrun --nproc-per-node 2 -m bench.ring          # or: python -m bench.ring (spawns one
                                                      # process per visible GPU)
    python -m bench.ring --jax                         # JAX: one process, a Mesh of every GPU

Ideal: a ring of n GPUs runs n times the tokens of one GPU in the time one
GPU runs its share, i.e. ``time_1gpu(T_local * n) / n`` per step; we report
the throughput against ``n`` times the one-GPU throughput at the same total
length (the work per GPU of a balanced causal ring).  Writes
bench-results/ring.json on rank 0.
"""

from __future__ import annotations

import os
import sys

B, H, D = 1, 16, 128
# mode: (causal, zigzag)
MODES = {"causal zig-zag": (True, True), "full": (False, False)}


def _bench(rank, n, t_local, iters=5):
    import torch
    import torch.distributed as dist

    import torch_api
    from bench.common import save

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device("cuda", rank))
    T = t_local * n
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )

    def timed(fn):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters / 1e3

    results = []
    for mode, (causal, zigzag) in MODES.items():
        lay = (lambda x: torch_api.zigzag_reorder(x, n)) if zigzag else (lambda x: x)
        local = [lay(x).narrow(1, rank * t_local, t_local).contiguous() for x in (q, k, v, do)]
        leaves = [x.requires_grad_(True) for x in local[:3]]

        def ring_step(leaves=leaves, local=local, causal=causal, zigzag=zigzag):
            out = torch_api.ring_attention(*leaves, causal=causal, zigzag=zigzag)
            torch.autograd.grad(out, leaves, local[3])

        t_ring = timed(ring_step)
        flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0) * 3.5
        result = {"mode": mode, "n_gpus": n, "T_local": t_local, "T_total": T, "ring_ms": t_ring * 1e3}
        if rank == 0:
            full = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]

            def single(full=full, causal=causal):
                out = torch_api.flash_attention(*full, causal=causal)
                torch.autograd.grad(out, full, do)

            t_one = timed_local(single, iters)
            result.update(
                one_gpu_ms_same_total=t_one * 1e3,
                ring_TFLOPs_total=flops / t_ring / 1e12,
                one_gpu_TFLOPs=flops / t_one / 1e12,
                fraction_of_ideal=(t_one / n) / t_ring,
            )
            print(result, flush=True)
            results.append(result)
        dist.barrier()
    if rank == 0:
        save("ring", results, {"device": torch.cuda.get_device_name(), "B": B, "H": H, "D": D})
    dist.barrier()
    dist.destroy_process_group()


def timed_local(fn, iters):
    import torch

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def bench_jax(t_local, iters=5):
    """The JAX ring over every visible GPU (each of ``MODES``, forward+backward)
    against ``flash_attention`` on one GPU with the whole sequence.

    ``ring``: ``ring_attention`` under ``shard_map`` on inputs already in the
    zig-zag layout and sharded along the sequence, as a model with sequence
    parallelism keeps them between layers (the PyTorch bench's setup too).
    ``ring_mesh``: ``ring_attention_mesh`` on global arrays, which also pays
    for the reorder into the layout and back, and the scatter and gather.
    ``XLA_FLAGS`` shows whether XLA's latency-hiding scheduler was asked for
    (it decides whether the ``ppermute`` overlaps the kernels)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_api
    from bench.common import save, time_per_call

    devices = jax.devices()
    n, T = len(devices), t_local * len(devices)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(key, (B, T, H, D), jnp.bfloat16) for key in keys)
    mesh = Mesh(np.array(devices), ("sp",))
    seq = P(None, "sp")

    def grads(attn):
        def fwd_bwd(q, k, v, do):
            out, pull = jax.vjp(attn, q, k, v)
            return out, pull(do)  # the output too: XLA may not drop forward work

        return jax.jit(fwd_bwd)

    sync = jax.block_until_ready
    one = [jax.device_put(x, devices[0]) for x in (q, k, v, do)]
    results = []
    for mode, (causal, zigzag) in MODES.items():

        def body(a, b, c, causal=causal, zigzag=zigzag):
            return jax_api.ring_attention(a, b, c, causal=causal, zigzag=zigzag, axis_name="sp")

        ring = grads(jax.shard_map(body, mesh=mesh, in_specs=(seq,) * 3, out_specs=seq, check_vma=False))
        lay = (lambda x: jax_api.zigzag_reorder(x, n)) if zigzag else (lambda x: x)
        laid = [jax.device_put(lay(x), NamedSharding(mesh, seq)) for x in (q, k, v, do)]
        ring_mesh = grads(
            lambda a, b, c, causal=causal, zigzag=zigzag: jax_api.ring_attention_mesh(
                mesh, "sp", a, b, c, causal=causal, zigzag=zigzag
            )
        )
        single = grads(lambda a, b, c, causal=causal: jax_api.flash_attention(a, b, c, causal=causal))
        t_ring = time_per_call(lambda f=ring, a=laid: f(*a), sync, iters=iters, reps=3, warmup=2)
        t_mesh = time_per_call(lambda f=ring_mesh: f(q, k, v, do), sync, iters=iters, reps=3, warmup=2)
        t_one = time_per_call(lambda f=single: f(*one), sync, iters=iters, reps=3, warmup=2)
        result = {
            "impl": "jax",
            "mode": mode,
            "n_gpus": n,
            "T_local": t_local,
            "T_total": T,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "ring_ms": t_ring * 1e3,
            "ring_mesh_ms": t_mesh * 1e3,
            "one_gpu_ms_same_total": t_one * 1e3,
            "fraction_of_ideal": (t_one / n) / t_ring,
            "fraction_of_ideal_mesh": (t_one / n) / t_mesh,
        }
        print(result, flush=True)
        results.append(result)
    save("ring_jax", results, {"device": str(devices[0].device_kind), "B": B, "H": H, "D": D})


def _spawned(rank, n, t_local, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _bench(rank, n, t_local)


def main(argv):
    import torch

    use_jax = "--jax" in argv
    argv = [a for a in argv if a != "--jax"]
    t_local = int(argv[0]) if argv else 32768
    if use_jax:
        bench_jax(t_local)
        return
    if "RANK" in os.environ:  # torchrun
        _bench(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), t_local)
        return
    n = torch.cuda.device_count()
    if n < 1:
        sys.exit("bench.ring needs CUDA GPUs")
    import torch.multiprocessing as mp

    mp.start_processes(_spawned, args=(n, t_local, 29533), nprocs=n, join=True, start_method="spawn")


if __name__ == "__main__":
    main(sys.argv[1:])
