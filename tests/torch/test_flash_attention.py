import numpy as np

from tests.frameworks import TorchFramework
from tests.reference import assert_close
from tests.reference_attention import attention_ref
from tests.suites.flash_attention import FlashAttentionSuite, make_case, vjp

FW = TorchFramework()


class TestTorchFlashAttention(FlashAttentionSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        # Head-first tensors transposed to [B, T, H, D] views, a sliced bias
        # and a transposed cotangent: read through their strides, no copy.
        case = make_case(np.random.default_rng(9), B=2, Tq=40, Tk=40, bias="BH")
        t = {
            n: FW.array(np.swapaxes(case[n], 1, 2).copy()).transpose(1, 2) for n in ("query", "key", "value")
        }
        wide = FW.array(np.concatenate([case["bias"], case["bias"]], axis=-1))
        t["bias"] = wide[..., :40]
        assert not any(x.is_contiguous() for x in t.values())
        do = np.random.default_rng(10).standard_normal((2, 40, 4, 16))
        do_t = FW.array(np.swapaxes(do, 1, 2).copy()).transpose(1, 2)
        (out, lse), grads = vjp(
            FW,
            lambda **d: FW.api.flash_attention(**d, causal=True, return_lse=True),
            t,
            (do_t, FW.array(np.zeros((2, 4, 40)))),  # on the test device, like the inputs
        )
        ref = attention_ref(**case, causal=True, do=do)
        assert_close(FW.numpy(out), ref["out"], "float32", "output")
        for n, r in (("query", "dq"), ("key", "dk"), ("value", "dv"), ("bias", "dbias")):
            assert_close(FW.numpy(grads[n]), ref[r], "float32", n)
