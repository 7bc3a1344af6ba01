#!/usr/bin/env bash
# Issue 19's asynchronous-scheduling run on the H200, one device call, from the repository
# root with .devcarry/ (bench/h200.sh's wheels and tokenizer, plus xgrammar and jsonschema
# wheels for the structured-output tests) and the base commit's tree under base/:
#   bash bench/h200_issue19.sh
# 1. same-run throughput, base then this tree (batches 1,64,256, prefill 512/8192 tokens);
# 2. same-run mixed load at 64 clients (caps none,512); 3. the engine tests on CUDA in
# float32 (the new sampling features of issue 16 first), with what time is left.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup 2>&1 | tee "$OUT/setup.log"  # installs the wheels, prints versions
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
EXTRA="--prefill-lens 512,8192" bash bench/h200_compare.sh base throughput
CAPS=none,512 bash bench/h200_compare.sh base mixed
rm -f "$OUT"/compare-*.log  # the JSON holds it all; at most 8 files come back
left=$((${TEST_BUDGET:-585} - SECONDS))
first="test_async_scheduling test_sampling_features test_structured_output test_sampling_draws
       test_sliding_window test_cuda_graphs test_hf_equivalence test_decode_burst test_requests"
files=""
for f in $first; do files+=" tests/actors/engine/$f.py"; done
for f in tests/actors/engine/test_*.py; do [[ $files == *" $f"* ]] || files+=" $f"; done
echo "engine tests on CUDA with ${left}s left"
DYNASK_TEST_DEVICE=cuda timeout $left python3 -m pytest -p no:cacheprovider -m "not slow" \
    -v -rf $files 2>&1 | tee "$OUT/tests-engine-cuda.log" | grep -v PASSED | tail -n 40
