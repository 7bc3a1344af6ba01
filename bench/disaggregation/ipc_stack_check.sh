#!/usr/bin/env bash
# One GPU, a tiny random Llama: `dynask run` prefill + decode over cuda_ipc, a few
# requests, then the KV blocks moved and every fallback's reason from the server log.
#   bash bench/disaggregation/ipc_stack_check.sh      (after gpu_serving.sh's set-up lines)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ipc-check
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devcarry/whl/*.whl || exit 1
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site PYTHONUNBUFFERED=1 DYNASK_CACHE_DIR=/tmp/dynask-cache
python3 -c 'from pathlib import Path; from bench.serving.gpu_stack import save_random_model
save_random_model(Path("/tmp/ipc-check/model"), Path(".devcarry/tokenizer"), "llama-tiny")'
python3 -m dynask.control_plane.cli run /tmp/ipc-check/model --device cuda --port 18990 \
    --prefill-workers 1 --decode-workers 1 --engines-per-gpu 2 --gpu-memory-utilization 0.3 \
    --kv-transport cuda_ipc --max-model-len 4096 --max-num-seqs 8 --log-level info \
    --database-url sqlite:////tmp/ipc-check/db.sqlite > /tmp/ipc-check/run.log 2>&1 &
server=$!
for _ in $(seq 1 60); do sleep 1; curl -s localhost:18990/health | grep -q '"ready"' && break; done
python3 - <<'PY'
import json, urllib.request
model = json.load(urllib.request.urlopen("http://127.0.0.1:18990/v1/models"))["data"][0]["id"]
for n in (300, 1000):
    body = {"model": model, "prompt": "hello world " * n, "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request("http://127.0.0.1:18990/v1/completions",
        data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    print(n, repr(json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["text"]))
PY
curl -s localhost:18990/metrics | grep dynask_disagg | grep -v '^#'
kill $server; sleep 2
grep -E -B3 -A30 "Traceback|the copy failed" /tmp/ipc-check/run.log | head -150 | tee "$OUT/ipc-check.log"
