"""Outputs and gradients of a family's float64 reference loop (its
``naive.py``), for the tests and the demo.  The loops take their array
module as an argument; without cotangents they run on numpy, and with
cotangents on float64 tensors of an autodiff module the caller hands in
(torch: this package imports no framework), whose autograd differentiates
the same plain loop, so that no hand-derived backward stands in the
reference."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def vjp_ref(fn: Callable, inputs: dict, cotangents=None, autodiff=None):
    """``(outputs, grads)`` in float64 numpy of ``fn(arrays, xp) ->
    outputs`` (a tuple; ``arrays`` by name, ``xp`` their module).

    inputs: numpy-convertible arrays by name (None: not given).
    cotangents: one per output (None where that output has none), or None
    for no gradient: then ``grads`` is None and ``fn`` runs on numpy.
    Else ``grads`` has, for every given input, the gradient of ``sum_i
    sum(outputs[i] * cotangents[i])`` (zeros where it does not depend on
    it), computed with ``autodiff`` (a module with ``tensor`` and
    ``autograd.grad``: torch)."""
    given = {n: np.asarray(a, np.float64) for n, a in inputs.items() if a is not None}
    if cotangents is None or all(c is None for c in cotangents):
        return tuple(np.asarray(o) for o in fn(given, np)), None
    if autodiff is None:
        raise ValueError("autodiff: the reference's gradients need an autodiff module (pass torch)")
    leaves = {n: autodiff.tensor(a, requires_grad=True) for n, a in given.items()}
    outputs = fn(leaves, autodiff)
    loss = sum(
        (o * autodiff.tensor(np.asarray(c, np.float64))).sum()
        for o, c in zip(outputs, cotangents, strict=True)
        if c is not None
    )
    names = list(leaves)
    found = autodiff.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    grads = {
        n: np.zeros(leaves[n].shape) if g is None else g.numpy() for n, g in zip(names, found, strict=True)
    }
    return tuple(o.detach().numpy() for o in outputs), grads
