"""The main job: one set of Triton kernels, called from JAX and from PyTorch
on the same buffers (shared over DLPack, no copy), giving the same bits.

Runs the compiled kernels on a CUDA GPU when there is one, and Triton's
interpreter on the CPU otherwise.  ``python demo.py`` (or ``nox -s demo``).
"""

import os
import shutil
import subprocess


def _has_cuda_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


# Both must be set before triton (and JAX) are imported.
if "TRITON_INTERPRET" not in os.environ and not _has_cuda_gpu():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import jax_api  # noqa: E402
import torch_api  # noqa: E402


def _same_bits(a_jax, b_torch) -> bool:
    return torch.equal(torch.from_dlpack(a_jax).cpu(), b_torch.detach().cpu())


def main():
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpreted else "cuda"
    print(
        f"kernels: {'Triton interpreter on the CPU' if interpreted else torch.cuda.get_device_name()}; "
        f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}"
    )

    # A packed batch: three sequences of 100, 0 and 150 tokens, 4 heads of
    # log-space decays (the gates of gated linear attention).
    torch.manual_seed(0)
    cu_t = torch.tensor([0, 100, 100, 250], dtype=torch.int32, device=device)
    g_t = torch.nn.functional.logsigmoid(torch.randn(1, 250, 4, device=device))
    w_t = torch.randn(1, 250, 4, device=device)
    # The JAX arrays alias the torch tensors' memory.
    cu_j, g_j, w_j = jnp.from_dlpack(cu_t), jnp.from_dlpack(g_t), jnp.from_dlpack(w_t)

    local, glob = "chunk_local_cumsum", "chunk_global_cumsum"
    cases = {
        f"{local}(chunk_size=64)": dict(fn=local, args=(64,), kw={}),
        f"{local}(chunk_size=16, reverse)": dict(fn=local, args=(16,), kw={"reverse": True}),
        f"{glob}(scale=0.5)": dict(fn=glob, args=(), kw={"softmax_scale": 0.5}),
        f"{glob}(reverse)": dict(fn=glob, args=(), kw={"reverse": True}),
    }
    print(f"\n{'op (packed, cu_seqlens=[0,100,100,250])':48} {'output':>14} {'gradient':>14}")
    ok = True
    for name, c in cases.items():
        # PyTorch: autograd.Function around the kernel.
        x_t = g_t.clone().requires_grad_(True)
        y_t = getattr(torch_api, c["fn"])(x_t, *c["args"], cu_seqlens=cu_t, **c["kw"])
        (y_t * w_t).sum().backward()

        # JAX: custom_vjp around the same kernel, jitted, cu_seqlens traced.
        def loss(x, cu, c=c):
            y = getattr(jax_api, c["fn"])(x, *c["args"], cu_seqlens=cu, **c["kw"])
            return jnp.sum(y * w_j), y

        (_, y_j), dx_j = jax.jit(jax.value_and_grad(loss, has_aux=True))(g_j, cu_j)
        same_y, same_dx = _same_bits(y_j, y_t), _same_bits(dx_j, x_t.grad)
        ok &= same_y and same_dx
        word = {True: "same bits", False: "DIFFER"}
        print(f"{name:48} {word[same_y]:>14} {word[same_dx]:>14}")

    ok &= _linear_attention(device)
    print("\nJAX and PyTorch ran the same kernels" + (" and agree bit for bit." if ok else ", but disagree!"))
    if not ok:
        raise SystemExit(1)


def _linear_attention(device) -> bool:
    """Gated linear attention on a packed batch, forward and every gradient,
    in both frameworks: recurrent with all four gates, chunk-parallel with a
    per-token gate, and lightning attention (chunk mode)."""
    torch.manual_seed(1)
    cu_t = torch.tensor([0, 40, 40, 100], dtype=torch.int32, device=device)
    T, HQ, H, K, V = 100, 4, 2, 32, 24
    logsig = torch.nn.functional.logsigmoid

    def rnd(*shape):
        return torch.randn(*shape, device=device)

    x = {"query": rnd(1, T, HQ, K), "key": rnd(1, T, H, K), "value": rnd(1, T, H, V)}
    x["initial_state"] = rnd(3, H, K, V)
    gates = {
        "g": logsig(rnd(1, T, H) + 2),
        "g_gamma": logsig(rnd(H) + 2),
        "gk": logsig(rnd(1, T, H, K) + 2),
        "gv": logsig(rnd(1, T, H, V) + 2),
    }
    cases = {
        "recurrent(g, g_gamma, gk, gv)": ("recurrent", gates, {}),
        "chunk_linear_attn(g)": ("chunk_linear_attn", {"g": gates["g"]}, {}),
        "lightning_attn(layer 2 of 8)": ("lightning_attn", {}, {"layer_idx": 2, "num_layers": 8}),
    }
    print(f"\n{'linear attention (cu_seqlens=[0,40,40,100])':48} {'output, state':>14} {'gradients':>14}")
    ok = True
    for name, (fn, g, kw) in cases.items():
        inputs = {**x, **g}
        leaves = {n: v.clone().requires_grad_(True) for n, v in inputs.items()}
        o_t, ht_t = getattr(torch_api, fn)(**leaves, cu_seqlens=cu_t, **kw)
        (o_t.square().sum() + ht_t.sum()).backward()

        def loss(d, cu, fn=fn, kw=kw):
            o, ht = getattr(jax_api, fn)(**d, cu_seqlens=cu, **kw)
            return jnp.sum(jnp.square(o)) + jnp.sum(ht), (o, ht)

        xj = {n: jnp.from_dlpack(v) for n, v in inputs.items()}
        (_, (o_j, ht_j)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(xj, jnp.from_dlpack(cu_t))
        same_out = _same_bits(o_j, o_t) and _same_bits(ht_j, ht_t)
        same_grad = all(_same_bits(grads[n], leaves[n].grad) for n in inputs)
        ok &= same_out and same_grad
        word = {True: "same bits", False: "DIFFER"}
        print(f"{name:48} {word[same_out]:>14} {word[same_grad]:>14}")
    return ok


if __name__ == "__main__":
    main()
