"""Registers and spills of every skinny-matmul kernel the engine may pick, without a GPU.

    python -m bench.engine.skinny_matmul_resources [--arch 90]

Compiles each candidate tile of ``actors/engine/cuda/skinny_matmul.py`` with each prologue
(none, SiLU·mul, RMSNorm, add + RMSNorm) for the one-row, 16-row and 64-row variants,
in bf16 with the specialisations of a real launch (aligned pointers, sizes % 16), through
Triton's ptxas for ``sm_ARCH``, and prints registers, stack (spills), shared memory and
whether the weight loads are 16-byte vectors or ``cp.async`` copies (and whether it
waits for the kernel before it: PDL, see ``pdl``); exits 1 if any
spills. A tile that spills here is slow on the
GPU whatever its timing; the device run then picks among the rest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dynask.actors.engine.cuda import skinny_matmul, triton_gemv

PROLOGUES = {"plain": (False, False, False), "gated": (True, False, False)}
PROLOGUES.update({"norm": (False, True, False), "norm+residual": (False, True, True)})
POINTERS = ("x_ptr", "w_ptr", "bias_ptr", "y_ptr", "res_ptr", "res_out_ptr", "norm_w_ptr")
FLAGS = ("HAS_BIAS", "GATED", "NORM", "HAS_RES", "BLOCK_N", "BLOCK_K", "SPLIT_K", "PDL")


def _signature(rows: int) -> dict[str, str]:
    signature = {name: "*bf16" for name in POINTERS}
    signature |= {"part_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    if rows == 1:
        signature |= {"n_dim": "i32", "k_dim": "i32"}
    else:
        sizes = ("m_rows", "n_dim", "k_dim", "x_stride", "y_stride")
        signature |= {name: "i32" for name in sizes}
        signature |= {"IEEE": "constexpr", "BLOCK_M": "constexpr"}
    return signature | {name: "constexpr" for name in FLAGS}


def _aligned(kernel: Any, signature: dict[str, str]) -> dict[tuple[int, ...], Any]:
    """What a launch specialises on: 16-byte aligned pointers, sizes and strides % 16."""
    sized = ("n_dim", "k_dim", "x_stride", "y_stride")
    return {
        (kernel.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, kind in signature.items()
        if kind.startswith("*") or name in sized
    }


def _usage(compiled: Any) -> dict[str, int]:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        text = subprocess.run(
            [cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True, check=True
        ).stdout
    fields = [f for line in text.splitlines() if "REG:" in line for f in line.split()]
    return {key: int(value) for key, value in (f.split(":") for f in fields if ":" in f)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    target = GPUTarget("cuda", parser.parse_args().arch, 32)
    spilling = 0
    for rows in (1, 16, 64):
        kernel = triton_gemv.gemv_kernel if rows == 1 else triton_gemv.skinny_matmul_kernel
        for tile in skinny_matmul.candidates(rows):
            for name, (gated, norm, residual) in PROLOGUES.items():
                constants: dict[str, Any] = {"HAS_BIAS": False, "GATED": gated, "NORM": norm}
                constants |= {"HAS_RES": residual, "BLOCK_N": tile.block_n}
                constants |= {"BLOCK_K": tile.block_k, "SPLIT_K": tile.split_k}
                constants |= {"PDL": target.arch >= 90}  # as the engine launches them
                if rows > 1:
                    constants |= {"IEEE": False, "BLOCK_M": skinny_matmul.dot_rows(rows)}
                options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
                signature = _signature(rows)
                source = ASTSource(kernel, signature, constants, _aligned(kernel, signature))
                compiled = triton.compile(source, target=target, options=options)
                usage = _usage(compiled)
                spilling += usage.get("STACK", 0) > 0
                ptx = compiled.asm["ptx"]
                pdl = " griddepcontrol" if "griddepcontrol.wait" in ptx else ""
                loads = (
                    "cp.async" if "cp.async" in ptx else "v4" if "ld.global.v4" in ptx else "scalar"
                )
                print(
                    f"rows {rows:2} {tile} {name:13}: {usage.get('REG')} registers, "
                    f"stack {usage.get('STACK')} B, shared {compiled.metadata.shared} B, "
                    f"loads {loads}{pdl}"
                )
    print(f"{spilling} variants spill")
    raise SystemExit(1 if spilling else 0)


if __name__ == "__main__":
    main()
