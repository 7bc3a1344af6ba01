#!/usr/bin/env bash
# Issue 19, admission under asynchronous scheduling, on the H200 in one device call, from the
# repository root with .devcarry/ (bench/h200.sh's wheels and tokenizer, the stack's wheels
# too) and the base commit's tree under base/ (`git archive main kv actors control_plane web
# migrations bench | tar x -C base`):
#   bash bench/h200_issue19_admission.sh
# 1. same-run mixed load at 64 clients, base then this tree (caps none,512); 2. the engine
# tests on CUDA in float32; 3. the whole stack (`bash bench/h200.sh stack`, no cap); 4. with
# the time left, this tree's throughput at batches 1 and 64 with the 4,096-token TTFT and
# an 8,192-token prefill. At most 8 files come back: the JSON (PNGs are drawn from it
# afterwards) and three logs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
budget=${BUDGET:-530}
bash bench/h200.sh setup 2>&1 | tee "$OUT/run.log"  # installs the wheels, prints versions
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
CAPS=none,512 bash bench/h200_compare.sh base mixed 2>&1 | tee -a "$OUT/run.log"
echo "engine tests on CUDA at ${SECONDS}s" | tee -a "$OUT/run.log"
DYNASK_TEST_DEVICE=cuda timeout 200 python3 -m pytest -p no:cacheprovider -m "not slow" -q -rf \
    tests/actors/engine 2>&1 | tee "$OUT/tests-engine-cuda.log" | tail -n 15
if [[ ${STACK:-1} == 1 ]]; then  # STACK=0 leaves it out (it needs the opentelemetry wheels)
    echo "stack at ${SECONDS}s" | tee -a "$OUT/run.log"
    STACK_TIMEOUT=$((budget - SECONDS - 100)) bash bench/h200.sh stack 2>&1 | tail -n 12 \
        | tee -a "$OUT/run.log"
fi
left=$((budget - SECONDS))
echo "throughput (4,096-token TTFT) with ${left}s left" | tee -a "$OUT/run.log"
timeout $left python3 -m bench.engine.throughput --device cuda --random-model llama-8b \
    --tokenizer .devcarry/tokenizer --batches 1,64 --prompt-len 512 --new-tokens 128 \
    --prefill-lens 8192 --max-batched-tokens 8192 --gpu-memory-utilization 0.55 \
    --ttft-prompt-len 4096 --ttft-trials 2 --skip-hf --out "$OUT/throughput-new.json" 2>&1 \
    | grep -v "triton compile" | tail -n 30 | tee -a "$OUT/run.log"
rm -f "$OUT"/compare-*.log "$OUT"/*.png "$OUT"/bench.log
ls "$OUT"
