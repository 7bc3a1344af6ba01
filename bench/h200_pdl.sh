#!/usr/bin/env bash
# Issue 19, programmatic dependent launch (actors/engine/cuda/pdl.py) on the H200, from the
# repository root after `bash bench/h200.sh setup`:
#   bash bench/h200_pdl.sh
# The CUDA kernel and graph tests with PDL on (TESTS=0 skips them), then graph replays of
# this tree with DYNASK_PDL=1 and =0 alternating in the same call (FLAGS, default "1 0 1 0";
# BATCHES, default 1,64). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_DEVICE=cuda DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer
if [[ ${TESTS:-1} == 1 ]]; then
    timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider \
        tests/actors/engine/test_pdl.py tests/actors/engine/test_skinny_matmul.py \
        tests/actors/engine/test_paged_kernels.py tests/actors/engine/test_cuda_graphs.py \
        tests/actors/engine/test_fused_ops.py 2>&1 | tail -n 25 | tee "$OUT/pdl-tests.log"
fi
run=0
for flag in ${FLAGS:-1 0 1 0}; do
    run=$((run + 1))
    log="$OUT/pdl-profile-$run-pdl$flag.log"
    DYNASK_PDL=$flag timeout "${PROFILE_TIMEOUT:-150}" python3 -m bench.engine.profile_step \
        --random-model llama-8b --tokenizer .devcarry/tokenizer --batches "${BATCHES:-1,64}" \
        --prompt-len 512 --max-batched-tokens 8192 > "$log" 2>&1
    echo "run $run DYNASK_PDL=$flag"
    grep -E "^replay batch|^batch " "$log"
done
