#!/usr/bin/env bash
# Issue 19's decode-kernel run on the H200 (the skinny matmul), one device call, from the
# repository root with .devcarry/ and the base commit's tree under base/:
#   bash bench/h200_decodefuse.sh
# 1. the new kernels' tests on CUDA (float32; a tiny Llama with the kernels forced against
# HF); 2. cuBLAS vs the Triton tiles per decode projection
# (bench.engine.skinny_matmul); 3. same-run throughput, base then this tree (batches
# 1,64,256); 4. with the time left (BUDGET seconds in all), float32 engine tests on CUDA.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup 2>&1 | tee "$OUT/setup.log"
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
DYNASK_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/actors/engine/test_skinny_matmul.py 2>&1 | tail -n 15 | tee "$OUT/tests-kernels.log"
timeout 90 python3 -m bench.engine.skinny_matmul --rows 1,16,64 --out "$OUT/skinny.json" 2>&1 \
    | tee "$OUT/skinny.log"
BATCHES=1,64,256 SIDE_TIMEOUT=${SIDE_TIMEOUT:-200} bash bench/h200_compare.sh base throughput
rm -f "$OUT"/compare-*.log
left=$((${BUDGET:-540} - SECONDS))
echo "float32 engine tests on CUDA with ${left}s left"
((left > 20)) && DYNASK_TEST_DEVICE=cuda timeout $left python3 -m pytest -p no:cacheprovider \
    -m "not slow" -q -rf tests/actors/engine/test_hf_equivalence.py \
    tests/actors/engine/test_cuda_graphs.py tests/actors/engine/test_fused_ops.py 2>&1 \
    | tail -n 15 | tee "$OUT/tests-engine-cuda.log"
