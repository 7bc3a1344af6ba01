#!/usr/bin/env bash
# The H200 runs of issues 8 and 19, as sent through the device tool from the repository root:
#   bash bench/h200.sh [tests,bench,mixed,stack,profile | all | setup]   (comma-separated, in order)
# It needs the ignored folder .devcarry/ (carried with the call): whl/ holds the wheels the
# device image lacks (xxhash; for `stack` also dask, distributed, starlette, ...: see
# bench/README.md), tokenizer/ the SmolLM2 tokenizer files. Logs and the JSON go to $OUT
# (and the JSON to bench/results/).
set -uo pipefail
what=${1:-all}
[[ $what == all ]] && what=tests,bench,mixed,stack,profile
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devcarry/whl/*.whl || exit 1
# The import namespace dynask.* over the top-level folders (as the Makefile does for mypy).
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv
python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'

run_tests() {
    timeout ${KERNELS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
        tests/actors/engine/test_paged_kernels.py tests/actors/engine/test_fused_ops.py \
        tests/actors/engine/test_cuda_graphs.py 2>&1 | tee "$OUT/tests-kernels.log"
    DYNASK_TEST_DEVICE=cuda timeout ${TESTS_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider \
        -m "not slow" ${ENGINE_TESTS:-tests/actors/engine} 2>&1 | tee "$OUT/tests-engine-cuda.log"
}

run_bench() {
    timeout ${BENCH_TIMEOUT:-560} python3 -m bench.engine.throughput --device cuda \
        --random-model llama-8b --tokenizer .devcarry/tokenizer \
        --batches "${BATCHES:-1,16,64,256}" --prompt-len 512 --new-tokens 128 \
        --prefill-lens 512,8192 --max-batched-tokens 8192 --gpu-memory-utilization 0.55 \
        --ttft-prompt-len 4096 --ttft-trials 2 ${BENCH_ARGS:-} \
        --out bench/results/engine-h200.json 2>&1 | tee "$OUT/bench.log"
    cp bench/results/engine-h200.json "$OUT/" 2>/dev/null
}

run_mixed() {
    timeout ${MIXED_TIMEOUT:-300} python3 -m bench.engine.mixed_load --device cuda \
        --random-model llama-8b --tokenizer .devcarry/tokenizer --clients 64 \
        --prompt-len 512 --new-tokens 128 --max-batched-tokens 2048 \
        --caps "${CAPS:-none,1024,512,256,128}" ${MIXED_ARGS:-} \
        --out bench/results/engine-mixed-h200.json 2>&1 | tee "$OUT/mixed.log"
    cp bench/results/engine-mixed-h200.json "$OUT/" 2>/dev/null
}

run_stack() {
    timeout ${STACK_TIMEOUT:-560} python3 -m bench.serving.gpu_stack \
        --tokenizer .devcarry/tokenizer --clients 1,16,64 --caps "${STACK_CAPS:-none}" \
        ${STACK_ARGS:-} --out bench/results/serve-h200-stack.json 2>&1 | tee "$OUT/stack.log"
    cp bench/results/serve-h200-stack.json "$OUT/" 2>/dev/null
    tail -n 40 /tmp/dynask-gpu-stack/*.log > "$OUT/stack-server.log" 2>/dev/null
}

run_profile() {
    timeout 300 python3 -m bench.engine.profile_step --random-model llama-8b \
        --tokenizer .devcarry/tokenizer --batches 1,16,64,256 --prompt-len 512 \
        --max-batched-tokens 8192 2>&1 | grep -v '^\s*$' | tee "$OUT/profile.log"
}

run_setup() { :; }  # the wheels and the versions above only

for part in ${what//,/ }; do
    "run_$part"
done
