#!/usr/bin/env bash
# Issue 19's skinny-projection sweep on the H200, one device call from the repository root
# with .devcarry/: bash bench/h200_skinny_sweep.sh
# 1. the skinny kernels' tests on CUDA (split-K included; a tiny Llama with the kernels
# forced against HF); 2. cuBLAS against a wide grid of Triton tiles (block sizes, warps,
# stages, split-K) per decode projection of Llama-3.1-8B at 1 and 64 rows, each tile's
# output checked (bench.engine.skinny_matmul --sweep). Logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup > "$OUT/setup.log" 2>&1
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
DYNASK_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/actors/engine/test_skinny_matmul.py tests/actors/engine/test_cuda_fast_paths.py \
    2>&1 | tail -n 15 > "$OUT/tests-kernels.log"
timeout ${SWEEP_TIMEOUT:-400} python3 -m bench.engine.skinny_matmul --sweep --rows ${ROWS:-64,1} \
    --ops ${OPS:-o,norm+qkv,down,norm+gate_up} --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
tail -n 30 "$OUT/sweep.log"
