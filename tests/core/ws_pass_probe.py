"""Compile small causal flash forwards written for Triton's Hopper
warp-specialisation pass (``tl.range(..., warp_specialize=True)``) for
sm_90, with no GPU, and print what came out (``{"num_warps": ...,
"setmaxnreg": ...}``; a pass failure raises).  Three shapes of the same
loop, which tests/core/test_ws_pass_pins.py pins: core_triton.attention.
flash_fwd_ws masks every block in one loop because the other two fail.
Run as a script (Triton must not be in interpreter mode): ``python -m
tests.core.ws_pass_probe SHAPE`` with SHAPE one of :data:`SHAPES`."""

from __future__ import annotations

import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# What each shape does after the loop of unmasked blocks (the first masks
# every block in the loop instead).
SHAPES = ("every block masked", "a second loop for the diagonal", "a masked block after the loop")


@triton.jit
def _block(q, k_desc, v_desc, start, acc, m_i, l_i, offs_m, MASK: tl.constexpr, BN: tl.constexpr):
    """One key block's online softmax step (causal mask with ``MASK``)."""
    k = k_desc.load([start, 0])
    v = v_desc.load([start, 0])
    s = tl.dot(q, k.T)
    if MASK:
        offs_n = start + tl.arange(0, BN)
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, -1.0e6)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def ws_probe_kernel(Q, K, V, OUT, T, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    SHAPE: tl.constexpr):  # fmt: skip
    """Causal attention of one head, ``[T, D]`` each, a query block a
    program; ``SHAPE`` indexes :data:`SHAPES`."""
    pid = tl.program_id(0)
    q_desc = tl.make_tensor_descriptor(Q, [T, D], [D, 1], [BM, D])
    k_desc = tl.make_tensor_descriptor(K, [T, D], [D, 1], [BN, D])
    v_desc = tl.make_tensor_descriptor(V, [T, D], [D, 1], [BN, D])
    o_desc = tl.make_tensor_descriptor(OUT, [T, D], [D, 1], [BM, D])
    q = q_desc.load([pid * BM, 0])
    offs_m = pid * BM + tl.arange(0, BM)
    acc = tl.zeros([BM, D], tl.float32)
    m_i = tl.full([BM], -1.0e6, tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    hi = pid * BM
    if SHAPE == 0:
        for start in tl.range(0, hi + BM, BN, warp_specialize=True):
            acc, m_i, l_i = _block(q, k_desc, v_desc, start, acc, m_i, l_i, offs_m, True, BN)
    elif SHAPE == 1:
        for start in tl.range(0, hi, BN, warp_specialize=True):
            acc, m_i, l_i = _block(q, k_desc, v_desc, start, acc, m_i, l_i, offs_m, False, BN)
        for start in tl.range(hi, hi + BM, BN, warp_specialize=True):
            acc, m_i, l_i = _block(q, k_desc, v_desc, start, acc, m_i, l_i, offs_m, True, BN)
    else:
        for start in tl.range(0, hi, BN, warp_specialize=True):
            acc, m_i, l_i = _block(q, k_desc, v_desc, start, acc, m_i, l_i, offs_m, False, BN)
        acc, m_i, l_i = _block(q, k_desc, v_desc, hi, acc, m_i, l_i, offs_m, True, BN)
    o_desc.store([pid * BM, 0], (acc / l_i[:, None]).to(OUT.dtype.element_ty))


def main():
    shape = SHAPES.index(sys.argv[1])
    signature = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "T": "i32"}
    constexprs = {"D": 128, "BM": 128, "BN": 128, "SHAPE": shape}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    source = ASTSource(ws_probe_kernel, signature, constexprs=constexprs)
    options = {"num_warps": 4, "num_stages": 2}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    print(json.dumps({"num_warps": compiled.metadata.num_warps, "setmaxnreg": ptx.count("setmaxnreg")}))


if __name__ == "__main__":
    main()
