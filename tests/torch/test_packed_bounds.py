import numpy as np
import pytest
import torch

from tests.frameworks import TorchFramework
from tests.suites.packed_bounds import PackedBoundsSuite


class TestPackedBounds(PackedBoundsSuite):
    fw = TorchFramework()


def _clamped_bounds(cu, T):
    """Each sequence's rows ``(lo, hi)``, clamped as the kernels clamp them:
    inside ``[0, T]``, never negative in length."""
    bounds = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        lo = min(max(a, 0), T)
        bounds.append((lo, min(max(b, lo), T)))
    return bounds


@pytest.mark.parametrize(
    "T,cu",
    [
        (70, [50, 60, 10, 20]),  # decreasing: a gap between covered rows
        (130, [3, 64, 64, 127]),  # first and last rows uncovered, an empty sequence
        (20, [5]),  # no sequence: every row
        (200, "wild"),  # 40 sequences (more than one block of bounds), out of order
        (200, [10] * 36 + [100, 150, 120, 199]),  # only sequences past the first block cover rows
        (40, [0, 39, 0, 39, 0, 39, 0, 39, 0, 40]),  # overlaps use up the chunk slots: row 39 has none
        (64, [0, 30, 64]),  # the valid case: nothing written
    ],
    ids=["gap", "ends", "none", "wild", "late", "no_slot", "valid"],
)
@pytest.mark.parametrize("chunk", [0, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_uncovered_rows(T, cu, chunk, dtype):
    # zero_uncovered_plan writes 0 in exactly the rows the op's kernels
    # leave unwritten (no clamped sequence covers them; with chunks, or no
    # chunk slot does), in every leading slice, and leaves the others as
    # they were (NaN here).
    from core_triton.common.launch import run_named
    from core_triton.common.sequences import chunk_offsets_plan, zero_uncovered_plan
    from torch_api._launch import launch

    if cu == "wild":
        cu = np.random.default_rng(0).integers(-50, T + 50, 41).tolist()
    n_seq = len(cu) - 1
    n_slots = -(-T // chunk) + n_seq if chunk else 0  # chunk.py's NS for packed input
    written, used = np.zeros(T, bool), 0
    for lo, hi in _clamped_bounds(cu, T):
        if chunk:
            n = min(-(-(hi - lo) // chunk), n_slots - used)
            used += n
            hi = min(hi, lo + n * chunk)
        written[lo:hi] = True
    if T == 40 and chunk:
        assert not written[39]  # the case reaches the slot clamp
    shape = (3, T, 2, 7)  # R = 14 columns, not a power of 2
    device = TorchFramework().device
    x = torch.full(shape, float("nan"), dtype=getattr(torch, dtype), device=device)
    steps = [zero_uncovered_plan("o", shape, dtype, 1, n_seq, chunk, n_slots)]
    if chunk:
        steps.insert(0, chunk_offsets_plan(n_seq, T, chunk, "chunk_offsets"))
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    out = run_named(steps, {"o": x, "cu_seqlens": cu_t}, launch)["o"]
    assert out.data_ptr() == x.data_ptr()
    got = out.float().cpu().numpy()
    assert np.isnan(got[:, written]).all()
    assert (got[:, ~written] == 0).all()


def _chunk_counts(cu, T, chunk=16):
    """Each sequence's count of ``chunk``-token chunks, its bounds clamped
    as the kernels clamp them (core_triton.common.sequences)."""
    return [-(-(hi - lo) // chunk) for lo, hi in _clamped_bounds(cu, T)]


def _run_filled(plan, cu):
    """The list that ``plan``'s one output holds after it runs on
    ``cu_seqlens = cu``, the output filled with -7 first (so that an entry
    the kernel leaves unwritten shows)."""
    import dataclasses

    from core_triton.common.launch import run_named
    from torch_api._launch import launch

    plan = dataclasses.replace(plan, outputs=tuple(dataclasses.replace(o, fill=-7.0) for o in plan.outputs))
    cu_t = torch.tensor(cu, dtype=torch.int32, device=TorchFramework().device)
    return run_named([plan], {"cu_seqlens": cu_t}, launch)[plan.output_names[0]].cpu().tolist()


@pytest.mark.parametrize(
    "T,cu",
    [
        (70, [50, 60, 10, 20]),  # decreasing: clamped to empty sequences
        (130, [3, 64, 64, 127]),  # an empty sequence, rows uncovered at both ends
        (1000, "random"),  # 150 sequences: several programs and blocks of ranks
        (300, "wild"),  # 100 entries out of order and out of range
        (640, [0, 64, 128, 192, 256, 320]),  # equal lengths: index order
    ],
    ids=["gap", "ends", "random", "wild", "ties"],
)
@pytest.mark.parametrize("sort", [True, False])
def test_sequence_order(T, cu, sort):
    # sequence_order_plan: the sequences by decreasing count of 16-token
    # chunks (their bounds clamped as the kernels clamp them), ties in index
    # order; a permutation, every entry written.
    from core_triton.common.sequences import sequence_order_plan

    rng = np.random.default_rng(1)
    if cu == "random":
        cu = np.sort(rng.integers(0, T + 1, 151)).tolist()
    elif cu == "wild":
        cu = rng.integers(-50, T + 50, 101).tolist()
    n_seq = len(cu) - 1
    chunks = _chunk_counts(cu, T)
    want = sorted(range(n_seq), key=lambda i: (-chunks[i], i)) if sort else list(range(n_seq))
    if cu != [0, 64, 128, 192, 256, 320]:
        assert sort is False or want != list(range(n_seq))  # the case reorders
    assert _run_filled(sequence_order_plan(n_seq, T, 16, "order", sort=sort), cu) == want


@pytest.mark.parametrize(
    "T,cu",
    [
        (70, [50, 60, 10, 20]),  # decreasing: clamped to empty sequences
        (130, [3, 64, 64, 127]),  # an empty sequence, rows uncovered at both ends
        (200, "wild"),  # 40 entries out of order and out of range
        (40, [0, 39, 0, 39, 0, 39, 0, 39, 0, 40]),  # overlaps: offsets past the slots
        (5000, "random"),  # 1500 sequences, many empty: several blocks of each phase
        (64, [0, 30, 64, 64]),  # the last sequence empty
        (20, [5]),  # no sequence
    ],
    ids=["gap", "ends", "wild", "overflow", "random", "last_empty", "none"],
)
def test_chunk_offsets_slot_table(T, cu):
    # chunk_offsets_plan's output: the clamped cumulative chunk counts, then
    # for each of the cdiv(T, 16) + N slots the sequence that owns it: the
    # largest n whose offset is at most the slot (find_sequence's answer),
    # 0 without sequences; every entry written.
    from core_triton.common.sequences import chunk_offsets_plan

    rng = np.random.default_rng(2)
    if cu == "wild":
        cu = rng.integers(-50, T + 50, 41).tolist()
    elif cu == "random":
        cu = np.sort(rng.integers(0, T + 1, 1501)).tolist()
    n_seq = len(cu) - 1
    offsets = np.cumsum([0, *_chunk_counts(cu, T)]).tolist()
    n_slots = -(-T // 16) + n_seq
    owners = [max([n for n in range(n_seq) if offsets[n] <= s], default=0) for s in range(n_slots)]
    if T == 40:
        assert offsets[-1] > n_slots  # the case overflows the slots
    assert _run_filled(chunk_offsets_plan(n_seq, T, 16, "co"), cu) == offsets + owners


def test_sequence_order_past_the_limit(monkeypatch):
    # More sequences than sequences.SORT_LIMIT: index order, every entry
    # written (the plan uncached: it reads the limit).
    from core_triton.common import sequences

    cu = np.sort(np.random.default_rng(3).integers(0, 1001, 151)).tolist()
    monkeypatch.setattr(sequences, "SORT_LIMIT", 100)
    assert _run_filled(sequences.sequence_order_plan.__wrapped__(150, 1000, 16, "order"), cu) == list(
        range(150)
    )
    monkeypatch.setattr(sequences, "SORT_LIMIT", 1024)
    assert _run_filled(sequences.sequence_order_plan.__wrapped__(150, 1000, 16, "order"), cu) != list(
        range(150)
    )
