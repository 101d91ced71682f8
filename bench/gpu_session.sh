#!/usr/bin/env bash
# Every check that needs the GPU machine, in one call (device time is scarce: one call, few starts).
# Stage first with bench/prepare_device.sh, then run from the repository root on the GPU machine:
#     bash bench/gpu_session.sh [energy] [equality] [cifar10] [ceiling] [speed] [wire] [graphs] [profile]
#                                                                        (no argument: the first three;
#                                                                        results under $OUT, else runs/gpu)
# The device tool allows 10 minutes a command: if all three do not fit, run `energy equality`, then
# `cifar10` in a second call while the machine is still warm.
# 1. issue 5: NVML energy of a 30 s training run vs nvidia-smi power x time (bench/energy_nvml.py);
# 2. issue 4: the same small CIFAR-10 simulation on CPU, CPU on one thread (the noise floor) and CUDA
#    with TF32 off and at torch's default (bench/cuda_vs_cpu.py);
# 3. issues 4+5: the CIFAR-10 check of issue 4 (cnn, 100 clients, 5 rounds) on CUDA with the energy
#    meter on auto (NVML there), then `edge-node energy` on that run;
# 4. issue 22 (`ceiling`, about a minute): bench/train_ceiling.py, what a training step alone runs at (one client
#    at a time, bf16, channels_last, compiled) for cnn and resnet18;
# 5. issue 22 (`speed`): bench/sim_speed.py on the cnn paper setting (100 clients, 5 epochs, batch 128; whole
#    batch vs the daemon's slices of 16, where a round's time goes), then one round of the resnet18 paper
#    setting (5 epochs). `ceiling speed` in one call: 314 s on an H100 (2026-11-26; docs/RESULTS.md).
# 6. issue 19 (`wire`, about 30 s): bench/wire.py on the machine's CPUs (the pull against a raw socket); its
#    grpcio, xxhash and cryptography come from .device/wheels (CPython 3.10 to 3.13) when the image lacks them. It
#    also needs numba (the decoder's compiled loop), which the image lacked on 2026-11-27 and which .device cannot
#    carry (llvmlite's wheel is 42 MB a Python version against the tool's 64 MiB): the step then fails, saying so.
# 7. `graphs` (about 2 minutes): bench/graphs_check.py, --cuda-graphs' captured step against the eager one (weights,
#    losses, images/s for cnn and resnet18), then a 10-client CIFAR-10 cnn run of 2 rounds without and with it.
# 8. issue 22 (`profile`, about 2 minutes): where a round's time goes with the graphs (cnn and resnet18,
#    one round each): bench/sim_speed.py --breakdown graphs.
# Each step's exit code is collected; the script exits non-zero if any step failed. $OUT gets at most
# 7 small files (the device tool returns 8): session.log, two JSON results, the CUDA run's records.
set -uo pipefail
out=${OUT:-runs/gpu}
mkdir -p "$out"
install() {  # install WHEEL...: from .device/wheels into /tmp/edge-site (first on PYTHONPATH)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/edge-site "$@"
}
if compgen -G ".device/wheels/*.whl" >/dev/null; then
    install .device/wheels/protobuf-*.whl .device/wheels/tomli_w-*.whl || exit 3
    export PYTHONPATH=/tmp/edge-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 EDGE_NODE_CACHE=/tmp/edge-cache
cifar=.device/cifar10-jpeg.tar.gz
runs=/tmp/edge-runs  # run directories (checkpoints are large) stay on the machine
log="$out/session.log"
: >"$log"
status=0
step() {  # step NAME CMD...: run, append its output to session.log, remember a failure
    local name=$1; shift
    echo "=== $name: $*" | tee -a "$log"
    "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc" | tee -a "$log"
    [ "$rc" -eq 0 ] || status=1
}
selected=" ${*:-energy equality cifar10} "
for s in $selected; do
    case $s in energy|equality|cifar10|ceiling|speed|wire|graphs|profile) ;;
        *) echo "gpu_session: unknown step '$s' (energy, equality, cifar10, ceiling, speed, wire, graphs, profile)" >&2
           exit 2;; esac
done
want() { [[ $selected == *" $1 "* ]]; }
step versions nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv
step python python3 -c 'import sys, torch, google.protobuf as p; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "protobuf", p.__version__)'
want energy && step energy_nvml python3 bench/energy_nvml.py --seconds 30 --output "$out/energy_nvml.json"
want equality && step cuda_vs_cpu python3 bench/cuda_vs_cpu.py --dataset cifar10 --data-dir "$cifar" --clients 10 \
    --neighbours 3 --rounds 3 --epochs 2 --samples-per-client 500 --json "$out/cuda_vs_cpu.json"
if want cifar10; then
    step cifar10_cuda python3 -m edge_node -v simulate --dataset cifar10 --data-dir "$cifar" --model cnn \
        --clients 100 --neighbours 10 --epochs 5 --batch-size 128 --density 0.5 --regrow random --rounds 5 \
        --planned-rounds 30 --partition dir:0.3 --seed 0 --device cuda --no-progress --fresh --output "$runs/cifar10-cnn-cuda"
    for f in rounds.jsonl energy.jsonl summary.json; do
        cp "$runs/cifar10-cnn-cuda/$f" "$out/cifar10_cuda_$f" 2>/dev/null
    done
    step cifar10_cuda_energy python3 -m edge_node energy "$runs/cifar10-cnn-cuda"
fi
want ceiling && step ceiling_cnn python3 bench/train_ceiling.py --device cuda --models cnn \
    --steps 30 --json "$out/ceiling_cnn.json"
want ceiling && step ceiling_resnet18 python3 bench/train_ceiling.py --device cuda --models resnet18 \
    --steps 20 --json "$out/ceiling_resnet18.json"
paper=(--dataset cifar10 --data-dir "$cifar" --clients 100 --neighbours 10 --batch-size 128 --density 0.5
       --partition dir:0.3 --device cuda --energy-backend auto --processes 1)
want speed && step sim_speed_cnn python3 bench/sim_speed.py "${paper[@]}" --model cnn --epochs 5 --rounds 2 --skip 1 \
    --compare-naive --breakdown --json "$out/sim_speed_cnn.json"
want speed && step sim_speed_resnet18 python3 bench/sim_speed.py "${paper[@]}" --model resnet18 --epochs 5 --rounds 1 \
    --skip 0 --timeout 240 --json "$out/sim_speed_resnet18.json"
if want wire; then
    python3 -c 'import grpc, xxhash, cryptography' 2>/dev/null ||
        step wire_deps install --find-links .device/wheels grpcio xxhash cryptography cffi pycparser
    step wire python3 bench/wire.py --server separate --malloc both --json "$out/wire.json"
fi
for model in cnn resnet18; do  # --repeats 0: the profiled round alone
    want profile && step "profile_graphs_$model" python3 bench/sim_speed.py "${paper[@]}" --model "$model" --epochs 5 \
        --repeats 0 --micro-batch 0 --cuda-graphs --breakdown graphs --json "$out/profile_graphs_$model.json"
done
want graphs && step graphs_check python3 bench/graphs_check.py --data-dir "$cifar" --json "$out/graphs_check.json"
exit $status
