#!/usr/bin/env bash
# Part 3 of the disaggregation benchmark on a 2-GPU machine, from the repository root:
#   bash bench/disaggregation/gpu.sh
# The UCXX wheels travel as the ignored folder .devcarry/ucx-whl/ (carried with the call);
# they are installed into .devcarry/ucx-site/ (kept on a warm machine). If the wheels
# exceed what one call may carry, carry .devcarry/ucx-whl/ in one call and
# .devcarry/ucx-whl2/ in the next: each call installs whatever it finds. JSON and the log
# go to $OUT (and the JSON to bench/results/disagg-gpu.json).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .devcarry/ucx-site
for folder in .devcarry/ucx-whl .devcarry/ucx-whl2; do
    if compgen -G "$folder/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target .devcarry/ucx-site "$folder"/*.whl || exit 1
    fi
done
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:$PWD/.devcarry/ucx-site PYTHONUNBUFFERED=1
export UCX_WARN_UNUSED_ENV_VARS=n
python3 -c 'import ucxx, msgpack, torch; print("ucxx", ucxx.__version__, "torch", torch.__version__)' \
    || { echo "missing wheels: carry .devcarry/ucx-whl2 too"; exit 3; }
nvidia-smi topo -m 2>&1 | head -5 | tee "$OUT/topo.txt"
timeout 500 python3 -m bench.disaggregation.gpu "$@" 2>&1 | tee "$OUT/disagg-gpu.log"
cp bench/results/disagg-gpu.json "$OUT/" 2>/dev/null
