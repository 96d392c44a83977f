#!/usr/bin/env python3
"""Writes src/kernels/cuda/hopper/wgmma.cuh: the inline-PTX wgmma.mma_async wrappers the
Hopper kernels use on a real GPU (every accumulator register is its own asm operand, so the
wrappers are long and regular). Run from the repository root after changing the shapes."""
import os

HEADER = '''// wgmma.mma_async wrappers for the Hopper kernels on a real GPU (sm_90a), written out by
// scripts/gen_wgmma_asm.py: inline PTX needs every accumulator register as its own operand.
// Included by device_seam.cuh in GPU builds only; the emulator's are in src/emu/wgmma.hpp.
#pragma once

#include <cstdint>

namespace ringattn::kernels::cuda::ptx {
'''


def gen(kind, n, elem, trans_b):
    regs = n // 2
    name = f"wgmma_{kind}_m64n{n}k16_{elem}" + ("_tb" if trans_b else "")
    if kind == "ss":
        sig = f"float (&d)[{regs}], uint64_t desc_a, uint64_t desc_b, int scale_d"
        a_op, b_op, s_op = f"%{regs}", f"%{regs + 1}", f"%{regs + 2}"
        tail = f"p, 1, 1, 0, {1 if trans_b else 0}"
    else:
        sig = f"float (&d)[{regs}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d"
        a_op = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        b_op, s_op = f"%{regs + 4}", f"%{regs + 5}"
        tail = f"p, 1, 1, {1 if trans_b else 0}"
    t = "bf16" if elem == "bf16" else "f16"
    body = [f"__device__ __forceinline__ void {name}({sig}) {{", "  asm volatile(",
            '      "{\\n.reg .pred p;\\n"', f'      "setp.ne.b32 p, {s_op}, 0;\\n"',
            f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} "']
    ds = [f"%{i}" for i in range(regs)]
    for i in range(0, regs, 16):
        pre = "{" if i == 0 else ""
        post = "}, " if i + 16 >= regs else ", "
        body.append(f'      "{pre}{", ".join(ds[i:i + 16])}{post}"')
    body.append(f'      "{a_op}, {b_op}, {tail};\\n}}\\n"')
    body.append("      : " + ", ".join(f'"+f"(d[{i}])' for i in range(regs)))
    if kind == "ss":
        body.append('      : "l"(desc_a), "l"(desc_b), "r"(scale_d));')
    else:
        body.append('      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));')
    body.append("}")
    return "\n".join(body) + "\n"


def main():
    parts = [HEADER]
    for elem in ("bf16", "f16"):
        parts.append(gen("ss", 64, elem, False))
        parts.append(gen("rs", 64, elem, False))  # S = Q·Kᵀ with Q in registers
        for n in (64, 128, 192, 256):  # O, dK, dV, dQ tiles: D or Dv wide
            parts.append(gen("rs", n, elem, True))
    parts.append("}  // namespace ringattn::kernels::cuda::ptx\n")
    path = os.path.join("src", "kernels", "cuda", "hopper", "wgmma.cuh")
    with open(path, "w") as f:
        f.write("\n".join(parts))


if __name__ == "__main__":
    main()
