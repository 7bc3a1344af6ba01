#!/usr/bin/env bash
# The CUDA fast paths (EngineConfig.cuda_fast_paths, on by default since 2026-12-01)
# against the kernels of before, in THIS tree, same run: bench.engine.throughput twice
# with the same arguments, with --no-cuda-fast-paths then with --cuda-fast-paths, and the
# on/off table of bench.engine.opt_in_compare. From the repository root, after
# `bash bench/h200.sh setup`:
#   TAG=NAME BATCHES=1,64,256 EXTRA="more throughput arguments" bash bench/h200_optin.sh
# Arguments as bench/h200_compare.sh's throughput mode; SIDE_TIMEOUT bounds each side
# (default 150 s). Two files come back: $OUT/TAG.json (the table and both reports) and
# $OUT/TAG.log (the tail of each side's output, then the table).
set -uo pipefail
OUT=${OUT:-/tmp/out}
tag=${TAG:-optin}
work=/tmp/optin-$tag
mkdir -p "$OUT" "$work"
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1
args=(--device cuda --random-model llama-8b --batches "${BATCHES:-1,64,256}" --prompt-len 512
      --new-tokens 128 --max-batched-tokens 8192 --gpu-memory-utilization 0.55
      --ttft-prompt-len 512 --ttft-trials 1 --skip-hf --tokenizer .devcarry/tokenizer)
args+=(${EXTRA:-})  # the last of a flag wins
for side in off on; do
    flag=(--no-cuda-fast-paths)
    [[ $side == on ]] && flag=(--cuda-fast-paths)
    echo "== $tag, fast paths $side" | tee -a "$OUT/$tag.log"
    timeout ${SIDE_TIMEOUT:-150} python3 -m bench.engine.throughput "${args[@]}" "${flag[@]}" \
        --out "$work/$side.json" 2>&1 | grep -v "triton compile" | tail -n 34 \
        | tee -a "$OUT/$tag.log"
done
python3 -m bench.engine.opt_in_compare "$work/off.json" "$work/on.json" --out "$OUT/$tag.json" \
    2>&1 | tee -a "$OUT/$tag.log"
