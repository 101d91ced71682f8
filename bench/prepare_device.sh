#!/usr/bin/env bash
# Stage what bench/gpu_session.sh needs on the GPU machine into .device/ (git-ignored, carried by
# the device tool): the CIFAR-10 tarball and the protobuf wheel our generated code requires.
# Run on the development machine from the repository root:  bash bench/prepare_device.sh [CIFAR_TGZ]
set -euo pipefail
cifar=${1:-../shared/datasets/cifar10-jpeg.tar.gz}
[ -f "$cifar" ] || { echo "prepare_device: no CIFAR-10 tarball at $cifar" >&2; exit 2; }
mkdir -p .device/wheels
cp "$cifar" .device/cifar10-jpeg.tar.gz
# The GPU image has torch, numpy, click, tqdm, psutil, pillow, matplotlib and nvidia-ml-py, but maybe an
# older protobuf than edge_node/v1 was generated for (the wheel is abi3, so any CPython >= 3.10 takes it),
# and no tomli-w (pure Python), which `edge-node simulate` imports for its TOML config files; the `wire` step
# (bench/wire.py: a gRPC pull on the machine's CPUs) needs grpcio, xxhash and cryptography (with cffi), the
# versions of this checkout's venv.
versions=$(.venv/bin/python -c 'import google.protobuf as p, importlib.metadata as m
print(p.__version__, *(m.version(d) for d in ("tomli-w", "grpcio", "xxhash", "cryptography", "cffi", "pycparser")))')
read -r protobuf tomli_w grpcio xxhash cryptography cffi pycparser <<<"$versions"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .device/wheels "protobuf==$protobuf" "tomli-w==$tomli_w" "grpcio==$grpcio" "xxhash==$xxhash" \
    "cryptography==$cryptography" "cffi==$cffi" "pycparser==$pycparser"
for python in 3.10 3.11 3.13; do  # the image's CPython is not known beforehand: its compiled wheels for each
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .device/wheels "grpcio==$grpcio" "xxhash==$xxhash" "cffi==$cffi"
done
du -sh .device
echo "now: run (device tool) with carry [\".device\"] and command: bash bench/gpu_session.sh"
