import numpy as np
import torch

from core_triton.attention.naive import attention_ref
from core_triton.attention.segment_ranges import segment_ranges_kernel
from tests.frameworks import TorchFramework
from tests.reference import assert_close
from tests.suites.flash_attention import make_case
from tests.suites.flash_segments import FlashSegmentsSuite
from torch_api import _flash


class TestTorchFlashSegments(FlashSegmentsSuite):
    fw = TorchFramework()


def test_ranges_reused_only_for_the_same_unchanged_ids(monkeypatch):
    """A layer after layer call with the same ids tensor makes its ranges
    once (torch_api._flash); ids changed in place, a new tensor and
    inference tensors make them again, and every call matches float64."""
    fw = TestTorchFlashSegments.fw
    made = []

    def spy(plan, inputs, real=_flash.launch):
        made.append(plan.kernel is segment_ranges_kernel)
        return real(plan, inputs)

    monkeypatch.setattr(_flash, "launch", spy)
    c = make_case(np.random.default_rng(9), Tq=70, Tk=70)
    x = [fw.array(c[n], "float32") for n in ("query", "key", "value")]
    ids = fw.array(np.zeros((1, 70), np.int32), "int32")

    def check(ids_np, launches, ids=ids):
        made.clear()
        out = fw.api.flash_attention(*x, q_segment_ids=ids, causal=True)
        want = attention_ref(**c, q_segment_ids=ids_np, causal=True)["out"]
        assert_close(fw.numpy(out), want, "float32")
        assert made.count(True) == launches, ids_np

    one = np.zeros((1, 70), np.int32)
    check(one, 1)
    check(one, 0)  # the same tensor, unchanged: the ranges of before
    ids[:, 40:] = 1  # in place: two documents now
    two = np.concatenate([np.zeros((1, 40), np.int32), np.ones((1, 30), np.int32)], axis=1)
    check(two, 1)
    check(two, 1, ids=ids.clone())  # the same values in a new tensor
    with torch.inference_mode():
        frozen = ids.clone()
        check(two, 1, ids=frozen)
        check(two, 1, ids=frozen)  # no version counter: never reused
