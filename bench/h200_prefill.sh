#!/usr/bin/env bash
# Issue 19's prefill part on the H200 (prefill key splits, cuDNN for long lone chunks, the
# short-prefill graph; --cuda-fast-paths, the default since 2026-12-01) in one device call, from
# the repository root with .devcarry/:
#   bash bench/h200_prefill.sh
# 1. the kernel tests on CUDA (the paged kernels split and not, the step's inputs, the
# fast paths' switch); 2. same-run comparison in this tree, fast paths off then on
# (bench/h200_optin.sh): prefill tok/s of 512 and 8,192 tokens and the 4,096-token TTFT
# cold and cached, batch 1 only; 3. the engine tests on CUDA in float32 that cover
# prefill (HF equality, sliding windows, the prefix cache, CUDA graphs with the short
# prefill graph); 4. bench.engine.prefill_probe (kernels and profiles, fast paths on).
# What comes back ($OUT, 7 files): tests.log, prefill.json, prefill.log, probe.json,
# probe.log and the probe's two profile tables.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash bench/h200.sh setup > /tmp/setup.log 2>&1 || { cat /tmp/setup.log; exit 1; }
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
export DYNASK_TEST_TOKENIZER=$PWD/.devcarry/tokenizer DYNASK_CACHE_DIR=/tmp/dynask-cache
{ cat /tmp/setup.log; python3 -c 'import torch; print("cudnn", torch.backends.cudnn.version())'
  date -u; } 2>&1 | tee "$OUT/tests.log"

timeout 90 python3 -m pytest -q -p no:cacheprovider tests/actors/engine/test_paged_kernels.py \
    tests/actors/engine/test_cuda_step.py tests/actors/engine/test_fused_ops.py \
    tests/actors/engine/test_cuda_fast_paths.py 2>&1 | tail -n 15 | tee -a "$OUT/tests.log"

TAG=prefill BATCHES=1 SIDE_TIMEOUT=100 EXTRA="--new-tokens 16 --prefill-lens 512,8192 \
--ttft-prompt-len 4096 --ttft-trials 3 --max-num-seqs 4" bash bench/h200_optin.sh

DYNASK_TEST_DEVICE=cuda timeout 110 python3 -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/actors/engine/test_hf_equivalence.py tests/actors/engine/test_sliding_window.py \
    tests/actors/engine/test_prefix_cache.py tests/actors/engine/test_cuda_graphs.py 2>&1 \
    | tail -n 15 | tee -a "$OUT/tests.log"

timeout 100 python3 -m bench.engine.prefill_probe --tokenizer .devcarry/tokenizer \
    --out "$OUT/probe.json" 2>&1 | grep -v "triton compile" | tail -n 60 | tee "$OUT/probe.log"
