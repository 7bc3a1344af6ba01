#!/usr/bin/env bash
# Same-run comparison on the GPU machine: a benchmark of an earlier commit (its tree unpacked
# under BASE: `git archive COMMIT | tar x -C BASE`), then this tree's, with the same
# arguments; from the repository root, after bench/h200.sh installed the carried wheels
# into /tmp/site:
#   bash bench/h200_compare.sh BASE [throughput|mixed]
# throughput: bench.engine.throughput at batches 1,64,256 (a base from before bench/ became
# a package runs its bench/engine.py); mixed: bench.engine.mixed_load at 64 clients.
# EXTRA adds arguments to both sides; TAG names the output files (default: the mode);
# SIDE_TIMEOUT bounds each side (default 150 s); REPEATS runs per batch, the best kept
# (default 2: the first run after start-up carries one-time costs, Triton compiles).
set -uo pipefail
base=${1:-base}
what=${2:-throughput}
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/nsb/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$base/$d" /tmp/nsb/dynask/$d; done
if [[ $what == throughput ]]; then
    args=(--device cuda --random-model llama-8b --batches "${BATCHES:-1,64,256}" --prompt-len 512
          --new-tokens 128 --max-batched-tokens 8192 --gpu-memory-utilization 0.55
          --ttft-prompt-len 512 --ttft-trials 1 --skip-hf --repeats "${REPEATS:-2}")
    module=(-m bench.engine.throughput)
    [[ -f $base/bench/engine.py ]] && base_module=(bench/engine.py) || base_module=("${module[@]}")
else
    args=(--device cuda --random-model llama-8b --clients 64 --prompt-len 512 --new-tokens 128
          --max-batched-tokens 2048 --caps "${CAPS:-none,512}" --requests-per-client 3)
    module=(-m bench.engine.mixed_load)
    base_module=("${module[@]}")
fi
args+=(${EXTRA:-})  # more arguments for both sides (the last of a flag wins)
(cd "$base" && PYTHONPATH=/tmp/nsb:$PWD:/tmp/site timeout ${SIDE_TIMEOUT:-150} python3 "${base_module[@]}" \
    "${args[@]}" --tokenizer ../.devcarry/tokenizer --out "$OUT/${TAG:-$what}-base.json" 2>&1 \
    | grep -v "triton compile" | tail -n 34 | tee "$OUT/compare-${TAG:-$what}-base.log")
PYTHONPATH=/tmp/ns:$PWD:/tmp/site timeout ${SIDE_TIMEOUT:-150} python3 "${module[@]}" "${args[@]}" \
    --tokenizer .devcarry/tokenizer --out "$OUT/${TAG:-$what}-new.json" 2>&1 \
    | grep -v "triton compile" | tail -n 34 | tee "$OUT/compare-${TAG:-$what}-new.log"
