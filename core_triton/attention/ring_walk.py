"""The ring's walk, written once for both bindings (planning:
core_triton.attention.ring).

A binding supplies a :class:`RingBackend`: how to launch a plan, move a
dict of arrays around the ring (a transfer is started, then waited for;
JAX's ``ppermute`` is a transfer that is done when started), and the few
array operations the walk needs.  The walk fixes the rest: the order of
launches and transfers, the log-sum-exp merge of partial results, the sinks
added once after it, the dK/dV accumulators that travel with their shard
and the bias gradient's columns.  Arrays combine with ``+`` and ``-`` (both
frameworks' arrays have them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from core_triton.attention import flash_call, softmax_parts
from core_triton.attention.ring import RingSchedule, RingStep
from core_triton.common.launch import run_steps


class RingBackend(Protocol):
    """What a binding gives the walk.  ``rank``: this device's place in the
    ring (an int, or a traced scalar)."""

    rank: Any

    def launch(self, plan, inputs: dict) -> list:
        """Run ``plan`` on ``inputs`` (arrays by name); its outputs."""

    def info(self, x):
        """The TensorInfo of an array."""

    def start(self, tree: dict, shift: int = 1) -> Any:
        """Send ``tree`` ``shift`` places on and receive the same from
        ``shift`` places back; a handle for :meth:`wait`."""

    def wait(self, handle) -> dict | None:
        """The dict that ``handle``'s transfer received (None for None)."""

    def offsets(self, offsets: tuple):
        """A step's piece offsets as an int32 array ``[pieces]``."""

    def cond(self, pred, skip: Callable, run: Callable, *carry):
        """``skip(*carry)`` where the traced ``pred`` holds, else
        ``run(*carry)``, deciding on the device."""

    def cast(self, x, dtype):
        """``x`` in ``dtype`` (another array's ``.dtype``), contiguous."""

    def bias_grad(self, bias, zero: bool):
        """A buffer of ``bias``'s shape and dtype, zeroed when ``zero``."""

    def put_columns(self, db, db_step, pieces: tuple):
        """``db`` with the step's bias gradient ``db_step`` (local key
        order) written at the global columns of ``pieces`` (RingStep)."""


def _unless_masked(ring: RingBackend, masked, run, skip, *carry):
    """``run(*carry)``, or ``skip(*carry)`` where the mask removes the step:
    decided here when the schedule knows, else on the device (the removed
    step's kernels are not launched)."""
    if masked is None or masked is False:
        return run(*carry)
    if masked is True:
        return skip(*carry)
    return ring.cond(masked, skip, run, *carry)


def _may_skip(step: RingStep) -> bool:
    """Whether the walk may launch nothing at ``step`` (masked_out True or
    traced)."""
    return step.masked_out is not None and step.masked_out is not False


def _inputs(ring: RingBackend, q, kv: dict, fixed: dict, bias, step: RingStep) -> dict:
    """A step's kernel inputs: this device's queries and index arrays, the
    visiting shard (key, value and its index arrays), the pieces' offsets
    and the bias."""
    inputs = {"q": q, **kv, **fixed}
    inputs.update(qoff=ring.offsets(step.q_offsets), koff=ring.offsets(step.k_offsets))
    if bias is not None:
        inputs["bias"] = bias
    return inputs


def forward(ring: RingBackend, plans, schedule: RingSchedule, q, kv: dict, fixed: dict, sink, bias):
    """``(out [B, T_local, HQ, Dv] float32, lse [B, HQ, T_local])`` over the
    ring.  ``kv``: this device's ``k``, ``v`` and the index arrays that
    travel with them (``kv_segment_ids``, ``kv_positions``); ``fixed``: the
    queries' (``q_segment_ids``, ``q_positions``).  The next shard is on
    its way while a step's kernels run."""
    out = lse = None
    for step in schedule.steps(ring.rank):
        pending = None if step.last else ring.start(kv)

        def run(out, lse, kv=kv, step=step):
            out_b, lse_b = run_steps(plans.forward, _inputs(ring, q, kv, fixed, bias, step), ring.launch)
            if out is None:  # the home step (first, never removed) starts the merge
                return out_b, lse_b
            plan = softmax_parts.ring_merge_plan(*out.shape[:3], out.shape[3])
            return tuple(ring.launch(plan, {"out": out, "lse": lse, "out_b": out_b, "lse_b": lse_b}))

        out, lse = _unless_masked(ring, step.masked_out, run, lambda *c: c, out, lse)
        kv = ring.wait(pending)
    if sink is not None:  # the sinks join the normaliser once
        plan = softmax_parts.ring_sinks_plan(*out.shape[:3], out.shape[3], ring.info(sink))
        out, lse = ring.launch(plan, {"out": out, "lse": lse, "softmax_aux": sink})
    return out, lse


def backward(
    ring: RingBackend, plans, schedule: RingSchedule, q, kv, fixed, bias, out, lse, dout, dlse, need_db
):
    """``(dq, dk, dv, db, delta)``: the gradients in the inputs' dtypes
    (``db`` None unless ``need_db``), and ``delta [B, HQ, T_local]``
    float32 (``rowsum(out * dout)`` less ``dlse``, the lse cotangent,
    unless None) for the sinks' gradient: each step's dQ launch makes it
    from the global ``out`` and ``dout``, the same at every step, and the
    home step's is returned.  ``kv``, ``fixed``: as for :func:`forward`.

    The float32 dK/dV accumulators of the visiting shard travel with it: a
    step adds its gradients to the ones that arrived and sends the sums on,
    and the next step's kernels run while they travel (they are waited for
    only when the next sum needs them).  After the walk they go home in one
    hop (``schedule.home_shift``)."""
    dkdv_plan, dq_plan = plans.grads(ring.info(dout), ring.info(out), dlse is not None)
    backward_inputs = flash_call.backward_inputs(ring.cast, out, lse, dout, dlse)
    k, v = kv["k"], kv["v"]
    steps = schedule.steps(ring.rank)
    # The bias gradient, only when asked for: one bias-sized array that each
    # step fills at its shard's columns (every column at most once; those of
    # steps the mask removes, or the walk does not reach, stay 0).
    db = dbias_plan = None
    if need_db:
        gaps = len(steps) < schedule.n or any(_may_skip(s) for s in steps)
        db, dbias_plan = ring.bias_grad(bias, gaps), plans.dbias(ring.info(dout))
    arriving = dq = delta = None  # the accumulators on their way here, the sum of dQ
    for step in steps:
        pending = None if step.last else ring.start(kv)

        def run(arriving, dq, db, kv=kv, step=step):
            inputs = {**_inputs(ring, q, kv, fixed, bias, step), **backward_inputs}
            dq_s, dk_s, dv_s, db_s, delta_s = flash_call.grads(
                ring.launch, dkdv_plan, dq_plan, dbias_plan, inputs
            )
            if step.index == 0:
                # Every step's delta is the same; the home step's (never
                # masked, so not inside a device-side condition) is kept.
                nonlocal delta
                delta = delta_s
            dq = dq_s if dq is None else dq + dq_s
            if db is not None:
                db = ring.put_columns(db, db_s, step.bias_pieces)
            # The accumulators that arrived (sent by the previous step)
            # belong to this step's shard; wait for them only now, after
            # its kernels.  None at the home step: nothing arrived.
            acc = ring.wait(arriving)
            if acc is None:
                return {"dk": dk_s, "dv": dv_s}, dq, db
            return {"dk": acc["dk"] + dk_s, "dv": acc["dv"] + dv_s}, dq, db

        def skip(arriving, dq, db):
            return ring.wait(arriving), dq, db

        acc, dq, db = _unless_masked(ring, step.masked_out, run, skip, arriving, dq, db)
        # They leave with their shard; after the walk they go home in one hop.
        arriving = ring.start(acc, schedule.home_shift() if step.last else 1)
        kv = ring.wait(pending)
    acc = ring.wait(arriving)
    dq, dk, dv = ring.cast(dq, q.dtype), ring.cast(acc["dk"], k.dtype), ring.cast(acc["dv"], v.dtype)
    return dq, dk, dv, db, delta


def split_index(q_segment_ids, kv_segment_ids, q_positions, kv_positions, mine: Callable):
    """``(fixed, moving)``: the index arrays that stay with the queries and
    those that travel with the key/value shard.  One segment-id array given
    is both sides'; one positions array given gets this device's global
    token indices (``mine()``, in its layout's order) for the other side."""
    fixed, moving = {}, {}
    qs = q_segment_ids if q_segment_ids is not None else kv_segment_ids
    ks = kv_segment_ids if kv_segment_ids is not None else q_segment_ids
    if qs is not None:
        fixed["q_segment_ids"], moving["kv_segment_ids"] = qs, ks
    if q_positions is not None or kv_positions is not None:
        local = mine() if q_positions is None or kv_positions is None else None
        fixed["q_positions"] = q_positions if q_positions is not None else local
        moving["kv_positions"] = kv_positions if kv_positions is not None else local
    return fixed, moving
