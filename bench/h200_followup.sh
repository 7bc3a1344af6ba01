#!/usr/bin/env bash
# After the first runs of the CUDA fast paths (issue 19) and of the id-driven block copy
# (issue 20), one device call from the repository root with .devcarry/:
#   BUDGET=580 bash bench/h200_followup.sh
# 1. the block-copy kernel tests and the CUDA IPC tests on CUDA; 2. the copy's launch
# profile (bench.disaggregation.ipc_launch_profile: the id kernel against the rows built
# on the device, same run) and bench.disaggregation.ipc_gpu (CUDA IPC of 1 GiB against
# copy_()); 3. decode throughput at batch 64 and 256, fast paths off/on twice, alternated
# (off, on, off, on: is batch 256's on/off drop the GPU's or the code's?); 4. with the
# time left, the whole stack (bench.serving.gpu_stack, 1/16/64 clients) with the
# fast paths off then on. Everything goes into $OUT/followup.tgz, the tables to stdout.
set -uo pipefail
OUT=${OUT:-/tmp/out}
work=/tmp/followup
mkdir -p "$OUT" "$work"
bash bench/h200.sh setup > "$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
pack() { tar czf "$OUT/followup.tgz" -C /tmp followup; }
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kv/test_block_copy_kernel.py \
    tests/kv/test_block_copy_cuda.py tests/kv/test_transfer_ipc_cuda.py 2>&1 | tail -n 4 \
    | tee "$work/tests.log"
timeout 90 python3 -m bench.disaggregation.ipc_launch_profile --out "$work/ipc-launch.json" \
    2>&1 | tee "$work/ipc-launch.log"
timeout 120 python3 -m bench.disaggregation.ipc_gpu 2>&1 | tee "$work/ipc.log"
cp bench/results/disagg-ipc-h200.json "$work/" 2>/dev/null
pack
for round in 1 2; do
    OUT=$work TAG=decode-$round BATCHES=64,256 SIDE_TIMEOUT=90 bash bench/h200_optin.sh \
        > /dev/null 2>&1
    tail -n 12 "$work/decode-$round.log"
done
pack
left=$((${BUDGET:-580} - SECONDS - 10))
echo "== stack with ${left}s left"
((left > 120)) && timeout $left python3 -m bench.serving.gpu_stack --tokenizer .devcarry/tokenizer \
    --clients 1,16,64 --cuda-fast-paths off,on --out "$work/serve-h200-stack.json" 2>&1 \
    | tee "$work/stack.log" | grep -v "^\s*$" | tail -n 30
tail -n 40 /tmp/dynask-gpu-stack/*.log > "$work/stack-server.log" 2>/dev/null
pack
