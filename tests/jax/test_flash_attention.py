import importlib

import jax
import jax.numpy as jnp
import numpy as np

from core_triton.attention.naive import attention_ref
from core_triton.common.runtime import interpreter_requested
from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.suites.flash_attention import FlashAttentionSuite, make_case

FW = JaxFramework()


class TestJaxFlashAttention(FlashAttentionSuite):
    fw = FW
    # On the interpreter, the kernel-level cases' cross-section (CI time);
    # on a GPU all of them: there the two launchers specialise the kernels'
    # arguments differently (tests/core/test_codegen.py).
    kernel_cases = not interpreter_requested()

    def test_jit_grad_with_traced_ids(self):
        # Segment ids and positions traced under jit; new values reuse the
        # compiled function and still give the right answer.
        case = make_case(np.random.default_rng(11), seg="both", pos="2d", Tq=40, Tk=40, sink="1d")
        dense = {n: jnp.asarray(case[n], jnp.float32) for n in ("query", "key", "value", "softmax_aux")}
        w = np.random.default_rng(12).standard_normal((1, 40, 4, 16))

        @jax.jit
        def loss(d, qs, ks, qp, kp):
            out = FW.api.flash_attention(
                **d, q_segment_ids=qs, kv_segment_ids=ks, q_positions=qp, kv_positions=kp, causal=True
            )
            return jnp.sum(out * w)

        for shift in (0, 5):
            ids = {n: jnp.asarray(case[n] + shift, jnp.int32) for n in ("q_positions", "kv_positions")}
            segs = {n: jnp.asarray(case[n], jnp.int32) for n in ("q_segment_ids", "kv_segment_ids")}
            grads = jax.grad(loss)(
                dense, segs["q_segment_ids"], segs["kv_segment_ids"], ids["q_positions"], ids["kv_positions"]
            )
            ref_case = dict(
                case, q_positions=case["q_positions"] + shift, kv_positions=case["kv_positions"] + shift
            )
            ref = attention_ref(**ref_case, causal=True, do=w)
            for n, r in (("query", "dq"), ("key", "dk"), ("value", "dv"), ("softmax_aux", "dsink")):
                assert_close(np.asarray(grads[n]), ref[r], "float32", n)

    def test_bias_not_differentiated(self, monkeypatch):
        # jax.lax.stop_gradient(bias), and a bias left out of argnums under
        # jit: JAX does not differentiate it, so no bias-gradient launch is
        # traced (symbolic_zeros), its cotangent is zero, and the other
        # gradients are those of the float64 reference.
        case = make_case(np.random.default_rng(17), B=2, Tq=30, Tk=41, bias="1H", sink="1d")
        arr = {n: jnp.asarray(case[n], jnp.float32) for n in case}
        w = np.random.default_rng(18).standard_normal((2, 30, 4, 16))
        # The module that launches the op's forward and backward.
        mod = importlib.import_module("jax_api._flash")
        real, traced = mod.launch, []

        def spy(plan, inputs):
            traced.append(plan)
            return real(plan, inputs)

        monkeypatch.setattr(mod, "launch", spy)

        def loss(q, k, v, sink, bias, stop):
            bias = jax.lax.stop_gradient(bias) if stop else bias
            out = FW.api.flash_attention(q, k, v, softmax_aux=sink, bias=bias, causal=True)
            return jnp.sum(out * w)

        ref = attention_ref(**case, causal=True, do=w)
        args = [arr[n] for n in ("query", "key", "value", "softmax_aux", "bias")]
        grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*args, True)
        assert np.all(np.asarray(grads[4]) == 0)
        jitted = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)), static_argnums=5)
        for got in (grads[:4], jitted(*args, False)):
            for g, r in zip(got, ("dq", "dk", "dv", "dsink"), strict=True):
                assert_close(np.asarray(g), ref[r], "float32", r)
        assert any("dq" in p.output_names for p in traced), "the spy saw no backward"
        assert all("dbias" not in p.output_names for p in traced)
        # Differentiated, the same bias gets its gradient launch.
        dbias = jax.grad(loss, argnums=4)(*args, False)
        assert_close(np.asarray(dbias), ref["dbias"], "float32", "dbias")
        assert any("dbias" in p.output_names for p in traced)
