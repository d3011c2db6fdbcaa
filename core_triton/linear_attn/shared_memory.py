"""Shared memory the chunk linear-attention kernels ask for, per tile choice.

An upper-bound model, in bytes per program (one CUDA block), of what Triton
allocates when it compiles each chunk kernel for Hopper (sm_90), so that
``chunk_linear_attn._tiles`` can pick tiles that launch (a block gets at most
``H100_SHARED_BYTES``; more raises Triton's ``OutOfResources`` at launch).

What takes shared memory (read off the TTGIR of sm_90 compiles):

- every tile loaded inside a pipelined loop, once per stage (``num_stages``
  buffers; 1 without pipelining);
- the B operand of a tensor-core ``tl.dot`` (wgmma reads it from shared
  memory), and operands converted to float32 for a dot with float32 states;
- with float32 inputs (``IEEE``: full-precision FMA dots) the ``[BT, BT]``
  float32 score tile, converted to a dot-operand layout through shared
  memory.

The model sums these without crediting Triton's reuse of buffers whose
lifetimes do not overlap, so it overestimates; tests/core/test_shared_memory.py
checks it against sm_90 compiles with Triton 3.9 (the GPU machine runs 3.6:
the overestimate is the safety margin, at least ``CALIBRATION_HEADROOM``
over every compiled worst case).  Element sizes: ``itemsize`` of the inputs
(2 for bf16/fp16, 4 for float32), ``state_itemsize`` of the chunk states
(4 when they are float32).
"""

from __future__ import annotations

# Shared memory one block may use on the H100 (sm_90): 227 KiB.
H100_SHARED_BYTES = 232_448
# The model must exceed each compiled worst case by this factor (tested):
# room for Triton versions that allocate a little differently.
CALIBRATION_HEADROOM = 1.05

KERNELS = (
    "chunk_state",
    "chunk_output",
    "chunk_output_segment",
    "chunk_state_backward",
    "chunk_dv",
    "chunk_dqk",
)


def need(
    kernel: str,
    BT: int,
    BK: int,
    BV: int,
    num_stages: int,
    itemsize: int,
    state_itemsize: int,
    ieee: bool,
    group: int = 1,
) -> int:
    """Modelled shared-memory bytes of one program of ``kernel`` with chunk
    ``BT`` and tiles ``BK x BV``; ``group``: query heads per state head
    (HQ // H), ``ieee``: float32 inputs with full-precision products."""
    e, s, S = itemsize, state_itemsize, max(1, num_stages)
    # Products of float32 inputs run on FMA units: the [BT, BT] score tile
    # goes through shared memory to reach the dot-operand layout.
    scores = BT * BT * 4 if ieee else 0
    if kernel == "chunk_state":
        # Loop over chunks: k^T [BK, BT], v [BT, BV], gates [BT]; then the
        # update's operands in the states' dtype.
        return S * (BK * BT * e + BT * BV * e + BT * 4) + BK * BT * s + BT * BV * s
    if kernel == "chunk_state_backward":
        # As chunk_state, but the query heads of a group are unrolled inside
        # the pipelined loop: one q^T [BK, BT] and do [BT, BV] buffer each.
        return S * (group * (BK * BT * e + BT * BV * e) + BT * 4) + BK * BT * s + BT * BV * s
    if kernel in ("chunk_output", "chunk_dv"):
        # Loop over K: q (k) [BT, BK], k^T (q^T) [BK, BT], the state tile
        # [BK, BV]; q converted for the state product; after the loop the
        # [BT, BT] scores times v (do) [BT, BV].
        loop = S * (2 * BT * BK * e + BK * BV * s)
        return loop + BT * BK * s + scores + BT * BV * e
    if kernel == "chunk_output_segment":
        # Loop over chunks: k^T [BK, BT], v [BT, BV], gates [BT] and the
        # group's q [BT, BK] (unrolled); the state [BK, BV], the
        # decay-weighted k^T [BK, BT], v and the scores [BT, BT] as dot
        # operands, in the inputs' dtype (the kernel's products are).
        loop = S * (BK * BT * e + BT * BV * e + group * BT * BK * e + BT * 4)
        return loop + (BK * BV + BK * BT + BT * BV + BT * BT) * e + scores
    if kernel == "chunk_dqk":
        # Loop over V: do, v [BT, BV] and h^T, dh^T [BV, BK]; do, v as float32
        # operands of the state products; k, q [BT, BK] as B operands.
        loop = S * (2 * BT * BV * e + 2 * BV * BK * s)
        return loop + 2 * BT * BV * s + 2 * BT * BK * e + scores
    raise ValueError(f"no shared-memory model for kernel {kernel!r}")


def halvings(n: int, low: int = 16) -> list[int]:
    """``n, n/2, ...`` down to ``low`` (``[n]`` when ``n <= low``)."""
    out = [n]
    while out[-1] > low:
        out.append(out[-1] // 2)
    return out


def candidates(BK: int, BV: int, num_stages: int) -> list[tuple[int, int, int]]:
    """(BK, BV, num_stages) to try, best first: the preferred tiles, then
    smaller tiles (BV before BK at equal size: BV only adds grid programs,
    while a smaller BK adds loop trips), then the same without pipelining."""
    pairs = sorted(
        ((bk, bv) for bk in halvings(BK) for bv in halvings(BV)),
        key=lambda p: (-p[0] * p[1], -p[0]),
    )
    stages = [num_stages] + ([1] if num_stages > 1 else [])
    return [(bk, bv, st) for st in stages for bk, bv in pairs]
