import pytest

from tests.frameworks import TorchFramework
from tests.suites.delta_rule import (
    DeltaRuleGpuSuite,
    DeltaRuleStepSuite,
    DeltaRuleSuite,
    check_case,
    make_case,
)

FW = TorchFramework()


class TestTorchDeltaRule(DeltaRuleSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        x, cu, cots = make_case(FW, gate="gk", B=2, T=20, HK=2, HV=4, seed=14)

        def fn(query, gk, **kw):
            q = query.transpose(1, 2).contiguous().transpose(1, 2)
            gg = gk.transpose(0, 1).contiguous().transpose(0, 1)
            assert not q.is_contiguous() and not gg.is_contiguous()
            return FW.api.gated_delta_rule(q, gk=gg, **kw, output_final_state=True, mode="chunk")

        check_case(FW, fn, x, cu, cots)

    def test_float64_is_refused(self):
        z = FW.torch.zeros(1, 2, 1, 3, dtype=FW.torch.float64, device=FW.device)
        with pytest.raises(TypeError, match="dtype"):
            FW.api.gated_delta_rule(z, z, z, z[..., 0])


class TestTorchDeltaRuleStep(DeltaRuleStepSuite):
    fw = FW

    def _step(self, arrays, state):
        torch = FW.torch
        ptr = state.data_ptr()
        with torch.no_grad():
            out, new = FW.api.gated_delta_rule_step(**arrays, state=state, use_qk_l2norm=True)
        # Updated in place: the same tensor and storage.
        assert new is state and state.data_ptr() == ptr
        return out, new

    def test_refuses_inputs_that_want_gradients(self):
        x, _, _ = make_case(FW, gate="g", B=2, T=1, K=4, V=3, seed=15)
        state = FW.array(x.pop("initial_state"))
        arrays = {n: FW.array(a).requires_grad_(n == "value") for n, a in x.items()}
        with pytest.raises(ValueError, match="no_grad"):
            FW.api.gated_delta_rule_step(**arrays, state=state)


class TestTorchDeltaRuleGpu(DeltaRuleGpuSuite):
    fw = FW
