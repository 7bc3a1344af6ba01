#!/usr/bin/env bash
# Graph replays of several trees in one call on the GPU machine (issue 19's kernel
# variants), from the repository root after `bash bench/h200.sh setup`:
#   bash bench/h200_variants.sh TREE...     (each unpacked like h200_compare.sh's BASE)
# Runs bench.engine.profile_step of each tree in turn, ROUNDS times (default 2), the trees
# alternating so that drift touches each alike; BATCHES (default 1,64). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in $(seq "${ROUNDS:-2}"); do
    for tree in "$@"; do
        name=$(basename "$tree")
        mkdir -p "/tmp/ns-$name/dynask"
        for d in kv actors control_plane web migrations; do
            ln -sfn "$PWD/$tree/$d" "/tmp/ns-$name/dynask/$d"
        done
        log="$OUT/variants-$name-$round.log"
        (cd "$tree" && PYTHONPATH=/tmp/ns-$name:$PWD:/tmp/site timeout "${PROFILE_TIMEOUT:-150}" \
            python3 -m bench.engine.profile_step --random-model llama-8b \
            --tokenizer ../.devcarry/tokenizer --batches "${BATCHES:-1,64}" --prompt-len 512 \
            --max-batched-tokens 8192 > "$log" 2>&1)
        echo "round $round $name"
        grep -E "^replay batch|^batch " "$log"
    done
done
