#!/usr/bin/env bash
# Issue 19: the fused gate|up + SiLU·mul GEMM on the H200, one device call from the
# repository root with .devcarry/:
#   bash bench/h200_gated.sh [sweep|compare|skinny]
# sweep: its kernel test on CUDA, then bench.engine.gated_gemm (cuBLAS + silu_and_mul
# against each tile at ROWS rows, default 256,2048,8192).
# skinny: the skinny kernels' tests on CUDA, then bench.engine.skinny_tma (decode
# projections at ROWS rows, default 64: cuBLAS against the TMA skinny GEMMs, split-K and
# stream-K, and the fused gate|up GEMM's 64-row tiles).
# compare: the CUDA tests that cover it (TESTS, default below: the kernel, the fast paths,
# the skinny chooser, PDL's bf16 equality), then bench/h200_compare.sh against the tree unpacked in base/
# (`git archive COMMIT | tar x -C base`, carried): decode at batch 1, 64, 256 and an
# 8,192-token prefill, ROUNDS times (default 1), MORE arguments to both. Logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup > "$OUT/setup.log" 2>&1
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
if [[ ${1:-sweep} == skinny ]]; then
    DYNASK_TEST_DEVICE=cuda timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -rf -p no:cacheprovider \
        tests/actors/engine/test_skinny_tma.py tests/actors/engine/test_skinny_matmul.py 2>&1 \
        | tail -n 30 > "$OUT/tests-skinny.log"
    tail -n 3 "$OUT/tests-skinny.log"
    timeout ${SWEEP_TIMEOUT:-400} python3 -m bench.engine.skinny_tma --rows ${ROWS:-64} \
        --out "$OUT/skinny-tma.json" 2>&1 | grep -v "triton compile" > "$OUT/skinny-tma.log"
    cat "$OUT/skinny-tma.log"
    exit
fi
if [[ ${1:-sweep} == sweep ]]; then
    DYNASK_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
        tests/actors/engine/test_gated_gemm.py 2>&1 | tail -n 15 > "$OUT/tests-gated.log"
    tail -n 3 "$OUT/tests-gated.log"
    timeout ${SWEEP_TIMEOUT:-300} python3 -m bench.engine.gated_gemm --rows ${ROWS:-256,2048,8192} \
        --out "$OUT/gated.json" 2>&1 | grep -v "triton compile" > "$OUT/gated.log"
    cat "$OUT/gated.log"
    exit
fi
TESTS=${TESTS:-"tests/actors/engine/test_gated_gemm.py tests/actors/engine/test_cuda_fast_paths.py
  tests/actors/engine/test_skinny_tma.py tests/actors/engine/test_skinny_matmul.py tests/actors/engine/test_pdl.py"}
DYNASK_TEST_DEVICE=cuda timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -rf -p no:cacheprovider $TESTS 2>&1 \
    | tail -n 60 > "$OUT/tests-gated.log"
tail -n 3 "$OUT/tests-gated.log"
for round in $(seq "${ROUNDS:-1}"); do
    TAG=gated-r$round BATCHES=1,64,256 SIDE_TIMEOUT=${SIDE_TIMEOUT:-200} \
        EXTRA="--prefill-lens 8192 ${MORE:-}" bash bench/h200_compare.sh base throughput > /dev/null 2>&1
    for side in base new; do
        echo "== round $round $side"
        tail -n 30 "$OUT/compare-gated-r$round-$side.log"
    done
done
