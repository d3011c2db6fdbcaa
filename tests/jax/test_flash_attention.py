import jax
import jax.numpy as jnp
import numpy as np

from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.reference_attention import attention_ref
from tests.suites.flash_attention import FlashAttentionSuite, make_case

FW = JaxFramework()


class TestJaxFlashAttention(FlashAttentionSuite):
    fw = FW

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
