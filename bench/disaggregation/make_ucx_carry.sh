#!/usr/bin/env bash
# Packs UCXX for CUDA 13 (ucxx-cu13 and what it loads) for the device machine, which has no
# index to install from: .devcarry/ucx-site.tar.xz, unpacked there on PYTHONPATH by
# gpu_serving.sh's `ucxx` part. The wheels are CPython 3.12 manylinux ones; libucx's
# static libraries, perftest and tools are dropped, and xz folds its duplicated shared
# objects (wheels hold no symlinks), so the whole is ~15 MB instead of ~75 MB of wheels.
#   bash bench/disaggregation/make_ucx_carry.sh     (from the repository root)
set -euo pipefail
DEST=${DEST:-.devcarry}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$work/whl" \
    "ucxx-cu13==0.52.*" "libucxx-cu13==0.52.*" "libucx-cu13>=1.19,<1.22" \
    "librmm-cu13==26.10.*" "rmm-cu13==26.10.*" rapids-logger "cuda-core>=0.5.1,<2" \
    "cuda-bindings==13.*" "cuda-pathfinder>=1.4.2" "nvidia-ml-py>=12"
python3 -m pip install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --only-binary=:all: "$work"/whl/*.whl
find "$work/site" -name '*.a' -delete
rm -rf "$work/site/bin" "$work/site/libucx/bin" "$work/site/libucx/include" \
    "$work"/site/libucx/lib/ucx/libucx_perftest*
mkdir -p "$DEST"
tar -C "$work/site" -cf - . | xz -9 -T2 > "$DEST/ucx-site.tar.xz"
ls -la "$DEST/ucx-site.tar.xz"
