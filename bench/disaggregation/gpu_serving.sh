#!/usr/bin/env bash
# Issue 20's H200 run (one GPU), as sent through the device tool from the repository root:
#   bash bench/disaggregation/gpu_serving.sh [tests,ipc,workers,stack,offload,mix,ucxx]
#   (default: all but ucxx, in order)
# Needs the ignored folder .devcarry/ (whl/: dask, distributed, starlette, ... wheels;
# tokenizer/: SmolLM2's files; see bench/README.md; for `ucxx` also ucx-site.tar.xz, made
# by bench/disaggregation/make_ucx_carry.sh). Logs and JSON go to $OUT and the JSON
# also to bench/results/.
set -uo pipefail
what=${1:-tests,ipc,workers,stack,offload,mix}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devcarry/whl/*.whl || exit 1
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1 DYNASK_CACHE_DIR=/tmp/dynask-cache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"

run_tests() {
    timeout 150 python3 -m pytest -q -s -p no:cacheprovider --durations=5 \
        tests/kv/test_transfer_ipc_cuda.py tests/kv/test_block_copy_cuda.py 2>&1 \
        | tee "$OUT/tests-ipc-cuda.log"
}
run_ipc() {
    timeout 120 python3 -m bench.disaggregation.ipc_gpu 2>&1 | tee "$OUT/ipc.log"
    cp bench/results/disagg-ipc-h200.json "$OUT/" 2>/dev/null
    # Where a transfer's time goes, phase by phase, per way of waiting for the copy.
    timeout 100 python3 -m bench.disaggregation.ipc_timeline 2>&1 | tee "$OUT/ipc-timeline.log"
    cp bench/results/disagg-ipc-timeline-h200.json "$OUT/" 2>/dev/null
    # The same transport's Python control on this host's CPU (shared memory, no GPU).
    timeout 60 python3 -m bench.disaggregation.ipc_control --repeats 200 \
        --out "$OUT/disagg-ipc-control-h200-host.json" 2>&1 | tee -a "$OUT/ipc.log"
}
run_workers() {  # CUDA IPC between real Dask worker processes, case by case
    timeout 150 python3 -m bench.disaggregation.ipc_worker_check 2>&1 | tee "$OUT/ipc-workers.log"
}
run_stack() {  # dynask run, a tiny model, prefill + decode over cuda_ipc: blocks moved
    timeout 150 bash bench/disaggregation/ipc_stack_check.sh 2>&1 | tee "$OUT/ipc-stack.log"
}
run_mix() {
    timeout ${MIX_TIMEOUT:-330} python3 -m bench.disaggregation.gpu_mix \
        --tokenizer .devcarry/tokenizer ${MIX_ARGS:-} 2>&1 | tee "$OUT/mix.log"
    cp bench/results/disagg-mix-h200.json "$OUT/" 2>/dev/null
    # The fallbacks' reasons ("remote prefill of ... failed (...)") and the last lines.
    for f in /tmp/dynask-gpu-mix/*.log; do
        echo "== $f"; grep -m 20 -E "remote prefill|Error|Traceback" "$f"; tail -n 15 "$f"
    done > "$OUT/mix-servers.log" 2>/dev/null
}
ucx_site() {  # unpacks the CUDA 13 UCXX wheels once, puts them on PYTHONPATH
    [ -d /tmp/ucx-site/ucxx ] || { mkdir -p /tmp/ucx-site \
        && tar -C /tmp/ucx-site -xJf .devcarry/ucx-site.tar.xz; } || return 1
    export PYTHONPATH=$PYTHONPATH:/tmp/ucx-site UCX_WARN_UNUSED_ENV_VARS=n
}
run_ucxx_probe() {  # which set-up a ucxx write between two GPU processes survives
    ucx_site || return 1
    timeout 400 python3 -m bench.disaggregation.ucxx_probe 2>&1 | tee "$OUT/ucxx-probe.log"
}
run_ucxx() {  # UCXX for CUDA 13: the CUDA tests, the transfer rate, the stack over it
    ucx_site || return 1
    python3 -c 'import ucxx; print("ucxx", ucxx.__version__, "UCX", ucxx.get_ucx_version())' \
        2>&1 | tee "$OUT/ucxx-tests.log"
    timeout 150 python3 -m pytest -q -s -p no:cacheprovider --durations=5 \
        tests/kv/test_transfer_ipc_cuda.py tests/kv/test_block_transports.py \
        tests/kv/test_transfer_ucxx_blocks.py 2>&1 | tee -a "$OUT/ucxx-tests.log"
    timeout 200 python3 -m bench.disaggregation.ipc_gpu --transport ucxx \
        --repeats ${UCXX_REPEATS:-10} 2>&1 | tee "$OUT/ucxx-rate.log"
    cp bench/results/disagg-ucxx-h200.json "$OUT/" 2>/dev/null
    KV_TRANSPORT=ucxx timeout 170 bash bench/disaggregation/ipc_stack_check.sh 2>&1 \
        | tee "$OUT/ucxx-stack.log"
}
run_offload() {
    timeout ${OFFLOAD_TIMEOUT:-160} python3 -m bench.offload.e2e_gpu --tokenizer .devcarry/tokenizer 2>&1 | grep -v '^\s*$' \
        | tee "$OUT/offload.log"
    cp bench/results/offload-e2e-h200.json "$OUT/" 2>/dev/null
}
for part in ${what//,/ }; do
    "run_$part"
done
