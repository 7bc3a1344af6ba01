#!/usr/bin/env bash
# Issue 19's prefill part on the H200 in one device call, from the repository root, with
# the tree of the base commit unpacked under BASE (`git archive COMMIT | tar x -C BASE`):
#   bash bench/h200_prefill.sh BASE
# 1. the kernel tests; 2. bench/h200_compare.sh (base, then this tree): prefill tok/s of
# 512 and 8,192 tokens and the 4,096-token TTFT cold and cached, batch 1 only; 3. the
# engine tests on CUDA in float32 that cover prefill (HF equality, sliding windows, the
# prefix cache, CUDA graphs); 4. bench.engine.prefill_probe (kernels and profiles).
# What comes back ($OUT, 8 files): tests.log, compare.log, prefill-{base,new}.json,
# probe.json, probe.log and the probe's two profile tables.
set -uo pipefail
base=${1:-base}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cmp
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devcarry/whl/*.whl || exit 1
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())'
  date -u; } 2>&1 | tee "$OUT/tests.log"

timeout 60 python3 -m pytest -q -p no:cacheprovider tests/actors/engine/test_paged_kernels.py \
    tests/actors/engine/test_cuda_step.py tests/actors/engine/test_fused_ops.py 2>&1 \
    | tail -n 15 | tee -a "$OUT/tests.log"

BATCHES=1 TAG=prefill OUT=/tmp/cmp EXTRA="--new-tokens 16 --prefill-lens 512,8192 \
--ttft-prompt-len 4096 --ttft-trials 3 --max-num-seqs 4" timeout 200 bash bench/h200_compare.sh "$base"
cat /tmp/cmp/compare-prefill-base.log /tmp/cmp/compare-prefill-new.log > "$OUT/compare.log"
cp /tmp/cmp/prefill-base.json /tmp/cmp/prefill-new.json "$OUT/" 2>/dev/null

DYNASK_TEST_DEVICE=cuda timeout 110 python3 -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/actors/engine/test_hf_equivalence.py tests/actors/engine/test_sliding_window.py \
    tests/actors/engine/test_prefix_cache.py tests/actors/engine/test_cuda_graphs.py 2>&1 \
    | tail -n 15 | tee -a "$OUT/tests.log"

timeout 100 python3 -m bench.engine.prefill_probe --tokenizer .devcarry/tokenizer \
    --out "$OUT/probe.json" 2>&1 | grep -v "triton compile" | tail -n 60 | tee "$OUT/probe.log"
