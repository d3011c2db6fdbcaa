"""The main job: one set of Triton kernels, called from PyTorch and from JAX
on the same buffers (shared over DLPack, no copy), each call checked against
a plain float64 reference.

Every op family runs forward and backward in both frameworks: the two
cumsums, recurrent / chunk / lightning linear attention and the gated delta
rule (both modes) on a packed batch, and flash attention (causal, grouped
queries, sinks).  For each, the table
shows the largest relative error (rms of the difference over rms of the
reference) of the outputs and of every gradient against the float64
reference, for each framework, and whether the two frameworks' results are
the same bits.  The compiled kernels run on a CUDA GPU when there is one,
Triton's interpreter on the CPU otherwise.  ``python demo.py`` (or
``nox -s demo``); it exits non-zero if an error passes float32's tolerance
(1e-5).
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
import numpy as np  # noqa: E402
import torch  # noqa: E402

import jax_api  # noqa: E402
import torch_api  # noqa: E402
from core_triton.attention.naive import attention_ref  # noqa: E402
from core_triton.cumsum.naive import cumsum_ref, cumsum_vjp_ref  # noqa: E402
from core_triton.delta_rule.naive import delta_rule_ref  # noqa: E402
from core_triton.linear_attn.naive import lightning_g_gamma, linear_attention_ref  # noqa: E402

TOLERANCE = 1e-5  # float32


def _rel(x, ref) -> float:
    x, ref = _np(x), _np(ref)
    return float(np.sqrt(np.mean((x - ref) ** 2)) / max(np.sqrt(np.mean(ref**2)), 1e-30))


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, np.float64)


def _run(api_name, fn, inputs: dict, cotangents: tuple, **kw):
    """Outputs (a tuple) and gradients (by input name) of ``fn`` of one
    binding for ``sum(<outputs, cotangents>)``.  PyTorch runs eagerly;
    JAX under ``jax.jit``.  ``inputs`` are torch tensors; JAX reads the same
    memory through DLPack."""
    if api_name == "torch":
        leaves = {n: t.clone().requires_grad_(t.is_floating_point()) for n, t in inputs.items()}
        outs = fn(torch_api, **leaves, **kw)
        outs = outs if isinstance(outs, tuple) else (outs,)
        float_leaves = [n for n, t in leaves.items() if t.requires_grad]
        grads = torch.autograd.grad(outs, [leaves[n] for n in float_leaves], cotangents)
        return outs, dict(zip(float_leaves, grads, strict=True))
    arrays = {n: jnp.from_dlpack(t) for n, t in inputs.items()}
    floats = {n: a for n, a in arrays.items() if jnp.issubdtype(a.dtype, jnp.floating)}
    ints = {n: a for n, a in arrays.items() if n not in floats}
    cts = tuple(jnp.from_dlpack(c) for c in cotangents)

    @jax.jit
    def run(floats, ints):
        def f(floats):
            outs = fn(jax_api, **floats, **ints, **kw)
            return outs if isinstance(outs, tuple) else (outs,)

        outs, pull = jax.vjp(f, floats)
        return outs, pull(cts)[0]

    return run(floats, ints)


def _same_bits(a, b) -> bool:
    return bool(np.array_equal(_np(a), _np(b)))


def _cases(device):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float().to(device)

    def logsig(*shape):
        return torch.nn.functional.logsigmoid(rnd(*shape) + 2)

    cu = [0, 40, 40, 100]  # three packed sequences, one of them empty
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    T, HQ, H, K, V = 100, 4, 2, 32, 24
    lin = {"query": rnd(1, T, HQ, K), "key": rnd(1, T, H, K), "value": rnd(1, T, H, V)}
    lin["initial_state"] = rnd(3, H, K, V)
    gates = {"g": logsig(1, T, H), "g_gamma": logsig(H), "gk": logsig(1, T, H, K), "gv": logsig(1, T, H, V)}
    d_lin = (rnd(1, T, HQ, V), rnd(3, H, K, V))
    x = logsig(1, T, 4)
    d_x = (rnd(1, T, 4),)
    B, Tq, D = 2, 96, 64
    att = {"query": rnd(B, Tq, 8, D), "key": rnd(B, Tq, 2, D), "value": rnd(B, Tq, 2, D)}
    att["softmax_aux"] = rnd(8)
    d_att = (rnd(B, Tq, 8, D),)
    # Delta rule: 1 key head, 2 value heads (Qwen3-Next groups value heads
    # on key heads), L2-normalised q and k.
    delta = {"query": rnd(1, T, 1, K), "key": rnd(1, T, 1, K), "value": rnd(1, T, 2, V)}
    delta["beta"] = torch.sigmoid(rnd(1, T, 2))
    delta["initial_state"] = rnd(3, 2, K, V, scale=0.1)
    d_delta = (rnd(1, T, 2, V), rnd(3, 2, K, V))

    def lin_ref(inputs, d, **kw):
        arrays = {n: _np(t) for n, t in inputs.items() if n != "cu_seqlens"}
        out, final, grads = linear_attention_ref(
            arrays, cu_seqlens=cu, d_output=_np(d[0]), d_final_state=_np(d[1]), autodiff=torch, **kw
        )
        return (out, final), grads

    def lightning_ref(inputs, d):
        H_ = inputs["key"].shape[2]
        arrays = {**inputs, "g_gamma": torch.tensor(lightning_g_gamma(H_, 2, 8))}
        (out, final), grads = lin_ref(arrays, d)
        grads.pop("g_gamma")
        return (out, final), grads

    def cumsum_case(chunk, reverse, scale):
        def ref(inputs, d):
            xs = _np(inputs["s"])
            out = cumsum_ref(xs, chunk, reverse, scale, cu, False)
            return (out,), {"s": cumsum_vjp_ref(_np(d[0]), chunk, reverse, scale, cu, False)}

        return ref

    def att_ref(inputs, d):
        q, k, v = (_np(inputs[n]) for n in ("query", "key", "value"))
        r = attention_ref(q, k, v, softmax_aux=_np(inputs["softmax_aux"]), causal=True, do=_np(d[0]))
        return (r["out"],), {"query": r["dq"], "key": r["dk"], "value": r["dv"], "softmax_aux": r["dsink"]}

    def delta_ref(inputs, d):
        arrays = {n: _np(t) for n, t in inputs.items() if n != "cu_seqlens"}
        out, final, grads = delta_rule_ref(arrays, None, cu, True, (_np(d[0]), _np(d[1])), torch)
        return (out, final), grads

    local = lambda api, s, cu_seqlens: api.chunk_local_cumsum(s, 16, reverse=True, cu_seqlens=cu_seqlens)  # noqa: E731
    glob = lambda api, s, cu_seqlens: api.chunk_global_cumsum(s, softmax_scale=0.5, cu_seqlens=cu_seqlens)  # noqa: E731
    return {
        "chunk_local_cumsum(16, reverse)": (
            local,
            {"s": x, "cu_seqlens": cu_t},
            d_x,
            cumsum_case(16, True, None),
        ),
        "chunk_global_cumsum(scale 0.5)": (
            glob,
            {"s": x, "cu_seqlens": cu_t},
            d_x,
            cumsum_case(None, False, 0.5),
        ),
        "recurrent(g, g_gamma, gk, gv)": (
            lambda api, **t: api.recurrent(**t),
            {**lin, **gates, "cu_seqlens": cu_t},
            d_lin,
            lin_ref,
        ),
        "chunk_linear_attn(g)": (
            lambda api, **t: api.chunk_linear_attn(**t),
            {**lin, "g": gates["g"], "cu_seqlens": cu_t},
            d_lin,
            lin_ref,
        ),
        "lightning_attn(layer 2 of 8)": (
            lambda api, **t: api.lightning_attn(**t, layer_idx=2, num_layers=8),
            {**lin, "cu_seqlens": cu_t},
            d_lin,
            lightning_ref,
        ),
        "gated_delta_rule(g, chunk, l2norm)": (
            lambda api, **t: api.gated_delta_rule(
                **t, use_qk_l2norm=True, mode="chunk", output_final_state=True
            ),
            {**delta, "g": logsig(1, T, 2), "cu_seqlens": cu_t},
            d_delta,
            delta_ref,
        ),
        "gated_delta_rule(gk, recurrent, l2norm)": (
            lambda api, **t: api.gated_delta_rule(
                **t, use_qk_l2norm=True, mode="recurrent", output_final_state=True
            ),
            {**delta, "gk": logsig(1, T, 2, K), "cu_seqlens": cu_t},
            d_delta,
            delta_ref,
        ),
        "flash_attention(causal, GQA 8/2, sinks)": (
            lambda api, **t: api.flash_attention(**t, causal=True),
            att,
            d_att,
            att_ref,
        ),
    }


def main():
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpreted else "cuda"
    print(
        f"kernels: {'Triton interpreter on the CPU' if interpreted else torch.cuda.get_device_name()}; "
        f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}; float32 inputs"
    )
    op_title = "op (packed cu_seqlens=[0,40,40,100] where it applies)"
    print(f"\n{op_title:44} {'torch vs f64':>13} {'jax vs f64':>11}  torch vs jax")
    worst = 0.0
    all_same = True
    for name, (fn, inputs, cts, ref) in _cases(device).items():
        ref_outs, ref_grads = ref({n: t for n, t in inputs.items()}, cts)
        errs, results = {}, {}
        for api in ("torch", "jax"):
            outs, grads = _run(api, fn, inputs, cts)
            results[api] = (outs, grads)
            e = [_rel(o, r) for o, r in zip(outs, ref_outs, strict=True)]
            e += [_rel(grads[n], ref_grads[n]) for n in ref_grads]
            errs[api] = max(e)
        (to, tg), (jo, jg) = results["torch"], results["jax"]
        same = all(_same_bits(a, b) for a, b in zip(to, jo, strict=True)) and all(
            _same_bits(tg[n], jg[n]) for n in tg
        )
        all_same &= same
        worst = max(worst, *errs.values())
        print(f"{name:44} {errs['torch']:13.1e} {errs['jax']:11.1e}  {'same bits' if same else 'differ'}")
    print(
        f"\nlargest relative error against float64, outputs and every gradient: {worst:.1e}"
        f" (float32 tolerance {TOLERANCE:.0e}); "
        + (
            "PyTorch and JAX gave the same bits everywhere."
            if all_same
            else "PyTorch and JAX differ somewhere."
        )
    )
    if worst > TOLERANCE:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
