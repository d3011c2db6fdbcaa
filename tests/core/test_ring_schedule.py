"""The ring's step schedule (core_triton.attention.ring.RingSchedule), which
both bindings walk: who visits at each step, the piece offsets, the bias
gradient's columns, and the steps the causal mask removes entirely."""

import pytest

from core_triton.attention.ring import RingSchedule, zigzag_order


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_shard_visits_once_and_every_bias_column_is_filled_once(n, zigzag):
    t_local = 8
    order = zigzag_order(n, n * t_local) if zigzag else list(range(n * t_local))
    for rank in range(n):
        steps = RingSchedule(n, t_local, zigzag).steps(rank)
        assert [s.index for s in steps] == list(range(n))
        assert sorted(s.src for s in steps) == list(range(n))
        assert steps[0].src == rank and [s.last for s in steps] == [False] * (n - 1) + [True]
        columns = []
        for s in steps:
            # The offsets turn local indices into global positions.
            shard = order[s.src * t_local : (s.src + 1) * t_local]
            pieces = len(s.k_offsets)
            c = t_local // pieces
            assert [i + s.k_offsets[i // c] for i in range(t_local)] == shard
            for a, g, length in s.bias_pieces:
                assert shard[a : a + length] == list(range(g, g + length))
                columns += range(g, g + length)
        assert sorted(columns) == list(range(n * t_local))


def _allowed_pairs(rank, src, t, causal, window):
    """Brute force: does any (query of shard rank, key of shard src) pair
    survive the mask (contiguous layout, global positions)?"""
    for q in range(rank * t, (rank + 1) * t):
        for k in range(src * t, (src + 1) * t):
            if causal and k > q:
                continue
            if window is not None and (q - k > window[0] or k - q > window[1]):
                continue
            return True
    return False


MASKS = [
    (True, None),
    (False, None),
    (True, (9, 0)),
    (False, (9, 0)),
    (False, (0, 0)),
    (True, (8, 0)),
    (False, (3, 5)),
    (False, (20, 1)),
    (True, (1, 7)),
]


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_masked_steps_and_span_match_brute_force(n, causal, window):
    t = 4
    sched = RingSchedule(n, t, False, causal=causal, window=window)
    m = sched.span()
    for rank in range(n):
        steps = sched.steps(rank)
        assert len(steps) == m and [s.last for s in steps] == [False] * (m - 1) + [True]
        for s in steps:
            assert s.masked_out is (not _allowed_pairs(rank, s.src, t, causal, window))
        # Steps past the span would have found nothing for any device.
        for s in range(m, n):
            assert not _allowed_pairs(rank, (rank - s) % n, t, causal, window)
        # After the walk the last shard's accumulators go home in one hop.
        assert (rank + sched.home_shift()) % n == steps[-1].src
    if window is not None and (causal or window[1] == 0):
        assert m == min(n, (0 if window[0] == 0 else (window[0] - 1) // t + 1) + 1)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_masked_out_unknown_or_never(n):
    t_local = 4
    for rank in range(n):
        assert not any(s.masked_out for s in RingSchedule(n, t_local, True, causal=True).steps(rank))
        explicit = RingSchedule(n, t_local, False, causal=True, explicit_positions=True).steps(rank)
        assert [s.masked_out for s in explicit] == [False] + [None] * (n - 1)
        zz = RingSchedule(n, t_local, True, causal=True, window=(3, 0)).steps(rank)
        assert len(zz) == n and [s.masked_out for s in zz] == [False] + [None] * (n - 1)


def test_masked_out_with_a_traced_rank():
    # The same expressions on arrays (JAX traces the rank): an array per
    # step that equals the int rank's answer.
    np = pytest.importorskip("numpy")
    sched = RingSchedule(4, 4, False, causal=True, window=(5, 0))
    for rank in range(4):
        ints = [s.masked_out for s in sched.steps(rank)]
        arrays = [s.masked_out for s in sched.steps(np.int32(rank))]
        assert [bool(a) for a in arrays] == ints


def test_plans_give_the_schedule_of_their_options():
    # The planner's schedule reads the validated options: a list window is
    # the pair, a one-sided window's open side unbounded, explicit positions
    # known from the position arrays.
    from core_triton.attention import ring
    from core_triton.common.launch import TensorInfo

    q = TensorInfo((1, 8, 2, 16), "float32", (256, 32, 16, 1))
    pos = TensorInfo((1, 8), "int32", (8, 1))
    assert ring.plans(q, q, q, 4, False, sliding_window=[8, 0], causal=True)[2] == RingSchedule(
        4, 8, False, causal=True, window=(8, 0)
    )
    sched = ring.plans(q, q, q, 4, True, sliding_window=(3, None), q_positions=pos)[2]
    assert sched.zigzag and sched.explicit_positions and not sched.causal
    assert sched.window[0] == 3 and sched.window[1] > 10**6
    assert ring.plans(q, q, q, 4, False)[2] == RingSchedule(4, 8, False)
