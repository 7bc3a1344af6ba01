#!/usr/bin/env bash
# Issue 19: do the compute-bound phases (decode at batch 256, the 8k prefill) run at the
# clock the roofline's matmul rate was measured at? One device call from the repository
# root with .devcarry/: bash bench/h200_clocks.sh
# Runs bench.engine.clocks_probe (nvidia-smi sampling clocks, power and clock-event
# reasons per phase). Logs, JSON and the raw samples go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup > "$OUT/setup.log" 2>&1
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.applications.graphics \
    --format=csv | tee "$OUT/gpu.csv"
timeout ${PROBE_TIMEOUT:-400} python3 -m bench.engine.clocks_probe --device cuda \
    --random-model llama-8b --tokenizer .devcarry/tokenizer --prefill-lens 8192 \
    --max-batched-tokens 8192 --batches "${BATCHES:-256,64}" --prompt-len 512 --new-tokens 128 \
    --skip-hf --gpu-memory-utilization 0.55 --out "$OUT/clocks.json" ${MORE:-} 2>&1 \
    | grep -v "triton compile" | tail -n 40 > "$OUT/clocks.log"
cat "$OUT/clocks.log"
