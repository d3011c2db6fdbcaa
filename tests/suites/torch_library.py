"""The torch_api ops as ``torch.library`` ops: every option combination the
op suites cover runs under ``torch.compile(fullgraph=True)`` (one graph,
forward and backward, the ``twinkernels`` ops in it) and gives eager's
values; ``torch.export`` keeps each op's forward; the custom ops pass
``torch.library.opcheck``.  On a GPU the same cases also capture and replay
in CUDA graphs (``torch.cuda.graph`` and ``mode="reduce-overhead"``).

Each case is ``(fn, inputs, grads)``: ``fn(**inputs)`` returns a tensor or
a tuple, ``grads`` names the inputs that are differentiated.  Inputs are
random (seeded) and small, so the interpreter runs them in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_api as api

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"


def _rand(*shape, scale=1.0, seed=0, dtype=torch.float32):
    g = np.random.default_rng(seed)
    return torch.tensor(g.standard_normal(shape) * scale, dtype=dtype, device=DEVICE)


def _ints(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _linear_inputs(T=11, HQ=4, H=2, K=8, V=8, gates=(), h0=False, packed=False, seed=0):
    B = 1 if packed else 2
    x = {
        "query": _rand(B, T, HQ, K, seed=seed, scale=0.5),
        "key": _rand(B, T, H, K, seed=seed + 1, scale=0.5),
        "value": _rand(B, T, H, V, seed=seed + 2),
    }
    log_decay = lambda *s: -torch.rand(*s, generator=torch.Generator().manual_seed(seed + 3)).to(DEVICE) / 2  # noqa: E731
    shapes = {"g": (B, T, H), "g_gamma": (H,), "gk": (B, T, H, K), "gv": (B, T, H, V)}
    for gate in gates:
        x[gate] = log_decay(*shapes[gate])
    n = 3 if packed else B
    if h0:
        x["initial_state"] = _rand(n, H, K, V, seed=seed + 4)
    options = {"cu_seqlens": _ints([0, 4, 4, T])} if packed else {}
    return x, options


def recurrent_cases():
    out = {}
    for name, gates, h0, reverse, packed in (
        ("plain", (), False, False, False),
        ("g_h0_packed", ("g",), True, False, True),
        ("g_gamma_reverse", ("g_gamma",), False, True, False),
        ("gk_gv_h0", ("gk", "gv"), True, False, False),
        ("all_gates_reverse_packed", ("g", "gk", "gv"), True, True, True),
    ):
        x, opts = _linear_inputs(gates=gates, h0=h0, packed=packed)
        opts["reverse"] = reverse
        out[f"recurrent-{name}"] = (lambda opts=opts, **t: api.recurrent(**t, **opts), x, tuple(x))
    return out


def chunk_cases():
    out = {}
    for name, gates, h0, reverse, packed, chunk in (
        ("plain", (), False, False, False, 16),
        ("g_h0_packed", ("g",), True, False, True, 16),
        ("g_gamma_reverse", ("g_gamma",), True, True, False, 32),
        ("g_reverse_packed", ("g",), False, True, True, 16),
    ):
        x, opts = _linear_inputs(T=37, gates=gates, h0=h0, packed=packed)
        opts.update(reverse=reverse, chunk_size=chunk, softmax_scale=0.3)
        out[f"chunk-{name}"] = (lambda opts=opts, **t: api.chunk_linear_attn(**t, **opts), x, tuple(x))
    for mode in ("chunk", "recurrent"):
        x, opts = _linear_inputs(T=19, h0=True, packed=mode == "chunk")
        opts.update(layer_idx=1, num_layers=4, mode=mode)
        out[f"lightning-{mode}"] = (lambda opts=opts, **t: api.lightning_attn(**t, **opts), x, tuple(x))
    return out


def cumsum_cases():
    out = {}
    T = 37
    for name, op, packed, head_first, extra in (
        ("local", "local", False, False, {"chunk_size": 16}),
        ("local_packed_reverse", "local", True, False, {"chunk_size": 8, "reverse": True}),
        ("local_head_first_scale", "local", False, True, {"chunk_size": 16, "softmax_scale": 0.5}),
        ("global", "global", False, False, {}),
        ("global_packed_vector", "global", True, False, {"reverse": True}),
        ("global_out_dtype", "global", False, True, {"output_dtype": torch.float32}),
    ):
        B = 1 if packed else 2
        shape = (B, 3, T) if head_first else (B, T, 3)
        if name == "global_packed_vector":
            shape = (B, T, 3, 4)
        dtype = torch.bfloat16 if name == "global_out_dtype" else torch.float32
        x = {"s" if op == "global" else "g": _rand(*shape, seed=5, dtype=dtype)}
        opts = dict(extra, head_first=head_first)
        if packed:
            opts["cu_seqlens"] = _ints([0, 5, 5, 22, T])
        fn = api.chunk_local_cumsum if op == "local" else api.chunk_global_cumsum
        out[f"cumsum-{name}"] = (lambda fn=fn, opts=opts, **t: fn(**t, **opts), x, tuple(x))
    return out


def flash_cases():
    out = {}
    B, T, S, HQ, H, D = 2, 24, 20, 4, 2, 16

    def qkv(dv=D, heads=H, tq=T, tk=T):
        return {
            "query": _rand(B, tq, HQ, D, seed=7),
            "key": _rand(B, tk, heads, D, seed=8),
            "value": _rand(B, tk, heads, dv, seed=9),
        }

    seg = np.repeat([[0, 1, 2]], B, 0).repeat(8, 1)
    for name, x, opts in (
        ("plain", qkv(), {}),
        ("causal_window", qkv(), {"causal": True, "sliding_window": (5, None)}),
        ("soft_cap_scale", qkv(dv=12, heads=HQ), {"logits_soft_cap": 5.0, "softmax_scale": 0.2}),
        ("sinks", {**qkv(), "softmax_aux": _rand(HQ, 2, seed=10)}, {"causal": True}),
        ("bias_grad", {**qkv(tk=S), "bias": _rand(1, HQ, T, S, seed=11)}, {}),
        ("segments", qkv(), {"q_segment_ids": _ints(seg), "kv_segment_ids": _ints(seg), "causal": True}),
        ("positions", qkv(tk=S), {"q_positions": _ints(np.arange(T) + 3), "causal": True}),
        ("return_lse", qkv(), {"return_lse": True, "sliding_window": 6}),
    ):
        out[f"flash-{name}"] = (lambda opts=opts, **t: api.flash_attention(**t, **opts), x, tuple(x))
    # Packed input (batch 1): query and key boundaries of their own.
    x = {
        "query": _rand(1, T, HQ, D, seed=13),
        "key": _rand(1, S, H, D, seed=14),
        "value": _rand(1, S, H, D, seed=15),
    }
    cu = {
        "cu_seqlens": _ints(np.array([0, 5, 24])),
        "cu_seqlens_k": _ints(np.array([0, 12, 20])),
        "causal": True,
    }
    out["flash-packed"] = (lambda **t: api.flash_attention(**t, **cu), x, tuple(x))
    # A bias that needs no gradient gets none (and the op launches none).
    x = {**qkv(), "bias": _rand(B, 1, T, T, seed=12)}
    out["flash-bias_no_grad"] = (lambda **t: api.flash_attention(**t), x, ("query", "key", "value"))
    return out


def delta_rule_cases():
    out = {}
    for name, gate, mode, packed, l2 in (
        ("chunk-gk-packed", "gk", "chunk", True, True),
        ("chunk-g", "g", "chunk", False, False),
        ("recurrent-g-packed", "g", "recurrent", True, True),
    ):
        B, T, HK, HV, K, V = (1 if packed else 2), 37, 1, 2, 8, 8
        x = {
            "query": _rand(B, T, HK, K, seed=40),
            "key": _rand(B, T, HK, K, seed=41, scale=K**-0.5),
            "value": _rand(B, T, HV, V, seed=42),
            "beta": torch.sigmoid(_rand(B, T, HV, seed=43)),
            gate: -torch.sigmoid(_rand(*((B, T, HV) if gate == "g" else (B, T, HV, K)), seed=44)),
            "initial_state": _rand(3 if packed else B, HV, K, V, seed=45),
        }
        opts = {"output_final_state": True, "use_qk_l2norm": l2, "mode": mode}
        if packed:
            opts["cu_seqlens"] = _ints([0, 20, 20, T])
        out[f"delta-{name}"] = (lambda opts=opts, **t: api.gated_delta_rule(**t, **opts), x, tuple(x))
    return out


def all_cases():
    return {**recurrent_cases(), **chunk_cases(), **cumsum_cases(), **flash_cases(), **delta_rule_cases()}


def _step_inputs():
    x = {
        "query": _rand(3, 1, 2, 8, seed=50),
        "key": _rand(3, 1, 2, 8, seed=51),
        "value": _rand(3, 1, 4, 8, seed=52),
        "beta": torch.sigmoid(_rand(3, 1, 4, seed=53)),
        "g": -torch.sigmoid(_rand(3, 1, 4, seed=54)),
    }
    return x, _rand(3, 4, 8, 8, seed=55)


def _step(state, **x):
    return api.gated_delta_rule_step(**x, state=state, use_qk_l2norm=True)[0]


CASES = all_cases()


def run(fn, inputs, grads, seed=20):
    """Outputs and the gradients of ``grads`` for random cotangents."""
    leaves = {n: t.detach().clone().requires_grad_(n in grads) for n, t in inputs.items()}
    outs = fn(**leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cts = [_rand(*o.shape, seed=seed + i, dtype=o.dtype) for i, o in enumerate(outs)]
    got = torch.autograd.grad(outs, [leaves[n] for n in grads], cts, allow_unused=True)
    return [o.detach() for o in outs], dict(zip(grads, got, strict=True))


def assert_same(a, b, what):
    outs_a, grads_a = a
    outs_b, grads_b = b
    assert len(outs_a) == len(outs_b)
    for x, y in zip(outs_a, outs_b, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype, what
        assert not torch.isnan(x).any(), what
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6, msg=lambda m: f"{what} output: {m}")
    assert grads_a.keys() == grads_b.keys()
    for n, x in grads_a.items():
        y = grads_b[n]
        assert x is not None and y is not None, f"{what}: no gradient for {n}"
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what} d{n}"
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6, msg=lambda m, n=n: f"{what} d{n}: {m}")


# Cases whose inputs another case of the same op has too (options that are
# no tensors go through the same registration): the interpreter leaves their
# fullgraph compile to the GPU (CI time: each runs the kernels twice).
SUBSUMED = {
    "delta-chunk-g", "chunk-plain", "chunk-g_reverse_packed", "recurrent-plain", "recurrent-g_h0_packed",
    "flash-plain", "flash-bias_no_grad", "flash-causal_window", "flash-soft_cap_scale", "cumsum-local",
    "cumsum-global", "cumsum-global_out_dtype", "cumsum-local_head_first_scale",
}  # fmt: skip


class TorchLibrarySuite:
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_compile_fullgraph_matches_eager(self, case):
        from torch._dynamo.testing import CompileCounterWithBackend

        from core_triton.common.runtime import interpreter_requested

        if case in SUBSUMED and interpreter_requested():
            pytest.skip("another case of this op has its inputs: the GPU compiles this one (CI time)")
        fn, x, grads = CASES[case]
        eager = run(fn, x, grads)
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=counter, fullgraph=True)
        assert_same(eager, run(compiled, x, grads), case)
        assert counter.frame_count == 1, f"{case}: {counter.frame_count} graphs"
        code = "\n".join(g.code for g in counter.graphs)
        assert "twinkernels" in code, f"{case}: the op is not in the graph:\n{code}"

    @pytest.mark.parametrize("case", ["flash-sinks", "chunk-g_h0_packed", "cumsum-global_packed_vector"])
    def test_compile_inductor(self, case):
        """The default backend (Inductor) around the ops."""
        fn, x, grads = CASES[case]
        eager = run(fn, x, grads)
        torch._dynamo.reset()
        assert_same(eager, run(torch.compile(fn, fullgraph=True), x, grads), case)

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_export(self, case):
        fn, x, _ = CASES[case]

        class Module(torch.nn.Module):
            def forward(self, *tensors):
                return fn(**dict(zip(x, tensors, strict=True)))

        args = tuple(x.values())
        program = torch.export.export(Module(), args)
        assert "twinkernels" in str(program.graph), case
        want = fn(**x)
        got = program.module()(*args)
        want, got = (v if isinstance(v, tuple) else (v,) for v in (want, got))
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0)

    @pytest.mark.parametrize(
        "case",
        [
            "recurrent-all_gates_reverse_packed",
            "chunk-g_h0_packed",
            "flash-bias_grad",
            "cumsum-local",
            "delta-chunk-gk-packed",
        ],
    )
    def test_opcheck(self, case):
        """Schema, fake (shapes, dtypes, strides) and autograd registration
        of the op and of its backward, as torch.library checks them."""
        import torch_api._library as lib

        fn, x, _ = CASES[case]
        seen = []
        real_call = lib.TorchOp.__call__

        def spy(op, *args):  # the op's arguments as the public function passes them
            seen.append((op, args))
            return real_call(op, *args)

        lib.TorchOp.__call__ = spy
        try:
            fn(**x)
        finally:
            lib.TorchOp.__call__ = real_call
        op, args = seen[0]
        args = [
            a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
            for a in args
        ]
        # Not "test_aot_dispatch_*": it compares every returned tensor, and
        # the residual chunk states have slots that no sequence uses (never
        # written, never read).  test_compile_fullgraph_matches_eager compares
        # the outputs and gradients under AOTAutograd instead.
        checks = ("test_schema", "test_faketensor", "test_autograd_registration")
        torch.library.opcheck(op.op, args, test_utils=checks)

    def test_step_compiles_and_updates_the_state(self):
        """The decoding step (it mutates its state) in one graph, with
        eager's values and the state updated in place."""
        from torch._dynamo.testing import CompileCounterWithBackend

        x, state = _step_inputs()
        with torch.no_grad():
            eager_state = state.clone()
            want = _step(eager_state, **x)
            counter = CompileCounterWithBackend("aot_eager")
            torch._dynamo.reset()
            compiled_state = state.clone()
            got = torch.compile(_step, backend=counter, fullgraph=True)(compiled_state, **x)
        assert counter.frame_count == 1
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(compiled_state, eager_state, rtol=0, atol=0)
        assert not torch.equal(compiled_state, state)

    def test_graph_breaks_none_in_a_block(self):
        """A small attention + linear-attention block: one graph."""
        from torch._dynamo.testing import CompileCounterWithBackend

        x = _rand(1, 16, 4, 16, seed=3)

        def block(x):
            h = api.flash_attention(x, x, x, causal=True)
            o, _ = api.chunk_linear_attn(
                h, x[:, :, :2], x[:, :, :2], g=-torch.sigmoid(x[..., :2, 0]), chunk_size=16
            )
            return (o * 2).sum()

        counter = CompileCounterWithBackend("aot_eager")
        torch._dynamo.reset()
        torch.compile(block, backend=counter, fullgraph=True)(x)
        assert counter.frame_count == 1


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")
class CudaGraphSuite:
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_cuda_graph_capture_and_replay(self, case):
        """Forward and backward captured once, replayed on new values."""
        fn, x, grads = CASES[case]
        static = {n: t.detach().clone().requires_grad_(n in grads) for n, t in x.items()}
        # The outputs' shapes without an autograd graph: a node made here, on
        # the default stream, and still alive during the capture would have
        # the backward sync the capturing stream with the legacy stream
        # ("operation would make the legacy stream depend on a capturing
        # blocking stream"), in some cases and not others.
        with torch.no_grad():
            outs_probe = fn(**static)
        outs_probe = outs_probe if isinstance(outs_probe, tuple) else (outs_probe,)
        cts = [_rand(*o.shape, seed=30 + i, dtype=o.dtype) for i, o in enumerate(outs_probe)]
        del outs_probe

        def step():
            outs = fn(**static)
            outs = outs if isinstance(outs, tuple) else (outs,)
            # A scalar loss whose gradient hands the op exactly ``cts`` (the
            # recipe of PyTorch's whole-network capture): no grad_outputs
            # made outside the capture for the engine to synchronise with.
            loss = sum((o.float() * c.float()).sum() for o, c in zip(outs, cts, strict=True))
            return outs, torch.autograd.grad(loss, [static[n] for n in grads], allow_unused=True)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()  # warm up: compile, plan, make constants
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_outs, g_grads = step()
        # New values in the captured inputs; the replay must follow them.
        fresh = {n: (t * 0.5 + 0.1 if t.is_floating_point() else t) for n, t in x.items()}
        with torch.no_grad():
            for n, t in fresh.items():
                static[n].copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        want = run(fn, fresh, grads, seed=30)
        assert_same(want, ([o.detach() for o in g_outs], dict(zip(grads, g_grads, strict=True))), case)

    def test_step_capture_and_replay(self):
        """The decoding step captured in a CUDA graph: each replay advances
        the captured state in place."""
        x, state = _step_inputs()
        ref_state = state.clone()
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                warm = state.clone()
                _step(warm, **x)  # compile and plan outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = _step(state, **x)
            state.copy_(ref_state)  # the capture ran nothing
            for _ in range(2):
                graph.replay()
                want = _step(ref_state, **x)
            torch.cuda.synchronize()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(state, ref_state, rtol=0, atol=0)

    @pytest.mark.parametrize(
        "case",
        [
            "flash-causal_window",
            "chunk-g_h0_packed",
            "recurrent-g_h0_packed",
            "lightning-chunk",
            "cumsum-global",
            "delta-chunk-gk-packed",
        ],
    )
    def test_reduce_overhead(self, case):
        fn, x, grads = CASES[case]
        eager = run(fn, x, grads)
        torch._dynamo.reset()
        compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # record, then replay from the CUDA graph
            got = run(compiled, x, grads)
        assert_same(eager, got, case)
