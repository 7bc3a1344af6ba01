#!/usr/bin/env bash
# Fills the ignored folder .devcarry/ that the H200 scripts carry to the device machine:
#   whl/        wheels (CPython 3.12, manylinux) of what the device image lacks, pinned to
#               the versions in this checkout's .venv
#   tokenizer/  the bundled SmolLM2's tokenizer files (converted from its GGUF)
# Run from the repository root after `make setup`: bash bench/make_devcarry.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEST=${DEST:-.devcarry}
PACKAGES="dask distributed partd locket tblib tornado zict cloudpickle toolz fsspec msgpack
psutil pyyaml click sortedcontainers SQLAlchemy greenlet alembic Mako starlette sse-starlette
uvicorn python-multipart itsdangerous httptools xxhash setproctitle sniffio anyio h11 gguf
partial-json-parser xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types
typing-inspection jsonschema jsonschema-specifications referencing rpds-py opentelemetry-api
opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-exporter-otlp-common
opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-proto-http
opentelemetry-exporter-otlp-proto-common opentelemetry-proto googleapis-common-protos
importlib-metadata zipp lazy-importer protobuf asyncssh cryptography cffi pycparser orjson"
mkdir -p "$DEST/whl" "$DEST/tokenizer"
pins=$("$PY" - $PACKAGES <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(f"missing from .venv: {name}", file=sys.stderr)
PYEOF
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d "$DEST/whl" $pins
"$PY" - "$DEST/tokenizer" <<'PYEOF'
import shutil, sys
from pathlib import Path
from dynask.actors.models.model_source import convert_gguf, default_model_path
folder = Path(convert_gguf(default_model_path()))
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
    if (folder / name).exists():
        shutil.copy(folder / name, sys.argv[1])
PYEOF
ls "$DEST/whl" | wc -l; du -sh "$DEST"
