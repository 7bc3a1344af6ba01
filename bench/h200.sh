#!/usr/bin/env bash
# The H200 run of issue 8, as sent through the device tool from the repository root:
#   bash bench/h200.sh [tests|bench|profile|all]
# It needs the ignored folder .devcarry/ (carried with the call): whl/ holds the wheels the
# device image lacks (xxhash), tokenizer/ the SmolLM2 tokenizer files. Logs and the JSON
# go to $OUT (and the JSON to bench/results/engine-h200.json).
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devcarry/whl/*.whl || exit 1
# The import namespace dynask.* over the top-level folders (as the Makefile does for mypy).
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv
python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'

if [[ $what == tests || $what == all ]]; then
    timeout 400 python3 -m pytest -q -p no:cacheprovider \
        tests/actors/engine/test_paged_kernels.py tests/actors/engine/test_fused_ops.py \
        tests/actors/engine/test_cuda_graphs.py 2>&1 | tee "$OUT/tests-kernels.log"
    DYNASK_TEST_DEVICE=cuda timeout 500 python3 -m pytest -q -p no:cacheprovider \
        -m "not slow" tests/actors/engine 2>&1 | tee "$OUT/tests-engine-cuda.log"
    # Informational: the same HF-equality tests in bf16 (see tests/actors/engine/helpers.py).
    DYNASK_TEST_DEVICE=cuda DYNASK_TEST_DTYPE=bfloat16 timeout 300 python3 -m pytest -q \
        -p no:cacheprovider -m "not slow" tests/actors/engine/test_hf_equivalence.py \
        tests/actors/engine/test_preemption.py 2>&1 | tee "$OUT/tests-engine-cuda-bf16.log"
fi
if [[ $what == bench || $what == all ]]; then
    timeout 560 python3 bench/engine.py --device cuda --random-model llama-8b \
        --tokenizer .devcarry/tokenizer --batches "${BATCHES:-1,16,64,256}" --prompt-len 512 \
        --new-tokens 128 --prefill-lens 512,8192 --max-batched-tokens 8192 \
        --gpu-memory-utilization 0.55 --ttft-prompt-len 4096 --ttft-trials 2 \
        ${BENCH_ARGS:-} --out bench/results/engine-h200.json 2>&1 | tee "$OUT/bench.log"
    cp bench/results/engine-h200.json "$OUT/" 2>/dev/null
fi
if [[ $what == profile || $what == all ]]; then
    (cd bench && timeout 300 python3 profile_step.py --random-model llama-8b \
        --tokenizer ../.devcarry/tokenizer --batches 1,16,64,256 --prompt-len 512 \
        --max-batched-tokens 8192 2>&1 | grep -v '^\s*$' | tee "$OUT/profile.log")
fi
