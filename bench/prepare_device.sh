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
# and no tomli-w (pure Python), which `edge-node simulate` imports for its TOML config files.
versions=$(.venv/bin/python -c 'import google.protobuf as p, importlib.metadata as m; print(p.__version__, m.version("tomli-w"))')
read -r protobuf tomli_w <<<"$versions"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .device/wheels "protobuf==$protobuf" "tomli-w==$tomli_w"
du -sh .device
echo "now: run (device tool) with carry [\".device\"] and command: bash bench/gpu_session.sh"
