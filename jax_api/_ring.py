"""The ring of ``ring_attention`` in JAX: the transport (``lax.ppermute``
along a ``shard_map`` axis, a transfer done when started: XLA overlaps it
with the kernels it does not depend on) and the array operations of
core_triton.attention.ring_walk's :class:`RingBackend`.  The rank is
traced: a step the mask may remove, depending on the device, runs its
kernels under ``lax.cond``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from core_triton.attention import ring as core
from jax_api._launch import info
from jax_api._launch import launch as launch_plan


class Ring:
    """This device's place on the ring of ``n`` devices along ``axis_name``;
    ``launch`` runs a plan (the op module's, which tests may watch)."""

    def __init__(self, axis_name, n: int, launch=launch_plan):
        self.axis_name, self.n, self._launch = axis_name, n, launch

    @property
    def rank(self):
        return lax.axis_index(self.axis_name)

    def start(self, tree, shift: int = 1):
        """Each device's ``tree`` on the device ``shift`` places on (0: stays)."""
        if shift % self.n == 0:
            return tree
        perm = [(i, (i + shift) % self.n) for i in range(self.n)]
        return jax.tree.map(lambda a: lax.ppermute(a, self.axis_name, perm), tree)

    @staticmethod
    def wait(handle):
        return handle

    def launch(self, plan, inputs):
        return self._launch(plan, inputs)

    info = staticmethod(info)

    @staticmethod
    def offsets(offsets):
        return jnp.stack([jnp.asarray(o, jnp.int32) for o in offsets])

    @staticmethod
    def cond(pred, skip, run, *carry):
        return lax.cond(pred, skip, run, *carry)

    @staticmethod
    def cast(x, dtype):
        return x.astype(dtype)

    @staticmethod
    def bias_grad(bias, zero):
        # Always zeroed: XLA has no uninitialised buffer (and updates it in place).
        return jnp.zeros(bias.shape, bias.dtype)

    @staticmethod
    def put_columns(db, db_step, pieces):
        for a, g, c in pieces:
            piece = lax.slice_in_dim(db_step, a, a + c, axis=3)
            db = lax.dynamic_update_slice_in_dim(db, piece, g, axis=3)
        return db

    def mine(self, t_local: int, zigzag: bool):
        """This device's global token indices (its layout's order)."""
        n = self.n
        order = core.zigzag_order(n, n * t_local) if zigzag else np.arange(n * t_local)
        return lax.dynamic_slice_in_dim(jnp.asarray(order, jnp.int32), self.rank * t_local, t_local)
