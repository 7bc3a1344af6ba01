#!/usr/bin/env bash
# Issue 19's decode-kernel run on the H200 (the skinny fused projections, --cuda-fast-paths,
# the default since 2026-12-01), one device call, from the repository root with .devcarry/:
#   bash bench/h200_decodefuse.sh
# 1. the new kernels' tests on CUDA (float32; a tiny Llama with the kernels forced against
# HF; the fast paths' switch's own tests); 2. cuBLAS vs the Triton tiles per decode
# projection (bench.engine.skinny_matmul); 3. same-run throughput in this tree, off then on
# (bench/h200_optin.sh, batches 1,64,256); 4. with the time left (BUDGET seconds in all),
# float32 engine tests on CUDA. Seven files come back.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup 2>&1 | tee "$OUT/setup.log"
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
DYNASK_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/actors/engine/test_skinny_matmul.py tests/actors/engine/test_cuda_fast_paths.py \
    2>&1 | tail -n 15 | tee "$OUT/tests-kernels.log"
timeout 90 python3 -m bench.engine.skinny_matmul --rows 1,16,64 --out "$OUT/skinny.json" 2>&1 \
    | tee "$OUT/skinny.log"
TAG=decode BATCHES=1,64,256 SIDE_TIMEOUT=${SIDE_TIMEOUT:-150} bash bench/h200_optin.sh
left=$((${BUDGET:-560} - SECONDS))
echo "float32 engine tests on CUDA with ${left}s left"
((left > 20)) && DYNASK_TEST_DEVICE=cuda timeout $left python3 -m pytest -p no:cacheprovider \
    -m "not slow" -q -rf tests/actors/engine/test_hf_equivalence.py \
    tests/actors/engine/test_cuda_graphs.py tests/actors/engine/test_fused_ops.py 2>&1 \
    | tail -n 15 | tee "$OUT/tests-engine-cuda.log"
