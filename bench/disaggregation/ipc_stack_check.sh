#!/usr/bin/env bash
# One GPU, a tiny random Llama: `dynask run` prefill + decode over cuda_ipc (or
# KV_TRANSPORT=ucxx, whose wheels gpu_serving.sh's `ucxx` part unpacks), then the same
# model aggregated (one engine); the same greedy prompts through both: the texts must be
# equal, and the disaggregated run must have moved KV blocks (its /metrics). Prints every
# fallback's reason from the server log.
#   bash bench/disaggregation/ipc_stack_check.sh      (gpu_serving.sh's `stack` part)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ipc-check
[ -d /tmp/site/distributed ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/site .devcarry/whl/*.whl || exit 1
mkdir -p /tmp/ns/dynask
for d in kv actors control_plane web migrations; do ln -sfn "$PWD/$d" /tmp/ns/dynask/$d; done
export PYTHONPATH=/tmp/ns:$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DYNASK_CACHE_DIR=/tmp/dynask-cache
python3 -c 'from pathlib import Path; from bench.serving.gpu_stack import save_random_model
save_random_model(Path("/tmp/ipc-check/model"), Path(".devcarry/tokenizer"), "llama-tiny")'

serve() {  # $1: name; the rest: dynask run's placement flags
    local name=$1; shift
    python3 -m dynask.control_plane.cli run /tmp/ipc-check/model --device cuda --port 18990 \
        --gpu-memory-utilization 0.3 --max-model-len 4096 --max-num-seqs 8 --log-level info \
        --database-url "sqlite:////tmp/ipc-check/$name.sqlite" "$@" > "/tmp/ipc-check/$name.log" 2>&1 &
    server=$!
    # /ready: every engine up (a request sent before the decode engine is up is served by
    # the prefill engine alone)
    for _ in $(seq 1 90); do
        sleep 1; curl -sf localhost:18990/ready | grep -q '"ready"' && break
        kill -0 $server 2>/dev/null || { echo "$name: dynask run exited"; tail -n 40 "/tmp/ipc-check/$name.log"; return 1; }
    done
    python3 - "$name" <<'PY'
import json, sys, urllib.request
base = "http://127.0.0.1:18990"
model = json.load(urllib.request.urlopen(f"{base}/v1/models"))["data"][0]["id"]
words = "river stone lamp orbit velvet quarry mint harbor signal cedar".split()
texts = []
for n in (90, 300, 1000, 2500):
    prompt = " ".join(words[(i * 7 + n) % len(words)] for i in range(n))
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}
    request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    texts.append(json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["text"])
json.dump(texts, open(f"/tmp/ipc-check/{sys.argv[1]}.json", "w"))
print(sys.argv[1], texts)
PY
    curl -s localhost:18990/metrics | grep dynask_disagg | grep -v '^#' | grep -v ' 0.0$'
    kill $server; wait $server 2>/dev/null; sleep 2
}

serve disagg --prefill-workers 1 --decode-workers 1 --engines-per-gpu 2 --kv-transport "${KV_TRANSPORT:-cuda_ipc}"
serve agg --workers 1
for name in disagg agg; do tail -n 30 "/tmp/ipc-check/$name.log" > "$OUT/ipc-$name-server.log"; done
python3 -c 'import json; a, d = (json.load(open(f"/tmp/ipc-check/{m}.json")) for m in ("agg", "disagg"))
print("greedy disagg == agg:", a == d, [x == y for x, y in zip(a, d)])'
grep -E -B3 -A30 "Traceback|the copy failed|remote prefill of" /tmp/ipc-check/disagg.log | head -150 \
    | tee "$OUT/ipc-check.log"
