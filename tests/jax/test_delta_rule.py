import jax
import jax.numpy as jnp
import numpy as np
import torch

from core_triton.delta_rule.naive import delta_rule_ref
from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.suites.delta_rule import (
    CU_SEQLENS,
    DeltaRuleGpuSuite,
    DeltaRuleStepSuite,
    DeltaRuleSuite,
    make_case,
)

FW = JaxFramework()


class TestJaxDeltaRule(DeltaRuleSuite):
    fw = FW
    kernel_cases = False

    def test_jit_grad_with_traced_cu_seqlens(self):
        x, cu, cots = make_case(FW, gate="g", packed=True, seed=16)
        arrays = {n: FW.array(a) for n, a in x.items()}
        do, dht = (FW.array(c) for c in cots)

        @jax.jit
        def loss(arrays, cu):
            o, ht = FW.api.gated_delta_rule(**arrays, output_final_state=True, cu_seqlens=cu, mode="chunk")
            return jnp.sum(o * do) + jnp.sum(ht * dht)

        value, grads = jax.value_and_grad(loss)(arrays, FW.array(CU_SEQLENS, "int32"))
        rounded = {n: FW.numpy(a) for n, a in arrays.items()}
        o, ht, ref = delta_rule_ref(rounded, None, CU_SEQLENS, False, cots, torch)
        np.testing.assert_allclose(float(value), np.sum(o * cots[0]) + np.sum(ht * cots[1]), rtol=1e-5)
        for n in arrays:
            assert_close(FW.numpy(grads[n]), ref[n], "float32", n)

    def test_vmap(self):
        # vmap over a leading axis: the op folds it into the batch.
        xs = [make_case(FW, gate="gk", B=2, T=30, seed=s)[0] for s in (17, 18)]
        stacked = {n: FW.array(np.stack([x[n] for x in xs])) for n in xs[0]}

        def fn(d):
            return FW.api.gated_delta_rule(**d, output_final_state=True, use_qk_l2norm=True, mode="chunk")

        outs, finals = jax.vmap(fn)(stacked)
        for i, x in enumerate(xs):
            o, h, _ = delta_rule_ref({n: FW.numpy(stacked[n][i]) for n in x}, use_qk_l2norm=True)
            assert_close(FW.numpy(outs[i]), o, "float32", "output")
            assert_close(FW.numpy(finals[i]), h, "float32", "final_state")


class TestJaxDeltaRuleStep(DeltaRuleStepSuite):
    fw = FW

    def test_donated_state(self):
        x, _, _ = make_case(FW, gate="g", B=2, T=1, K=8, V=4, seed=19)
        state = x.pop("initial_state")
        arrays = {n: FW.array(a) for n, a in x.items()}
        step = jax.jit(lambda d, s: FW.api.gated_delta_rule_step(**d, state=s), donate_argnums=1)
        out, new = step(arrays, FW.array(state))
        ref_out, ref_state, _ = delta_rule_ref({**{n: FW.numpy(a) for n, a in arrays.items()},
                                                "initial_state": state})  # fmt: skip
        assert_close(FW.numpy(out), ref_out, "float32", "output")
        assert_close(FW.numpy(new), ref_state, "float32", "state")


class TestJaxDeltaRuleGpu(DeltaRuleGpuSuite):
    fw = FW
