#!/usr/bin/env bash
# The performance benchmark of one GPU host, world size 1, in one device call (about 9 minutes):
#  1. Llama 16 x 2048 + PEFT LoRA, batch 4, 3 rounds, interleaved (scripts/bench_lifecycle.py):
#     reentrant checkpointing on pristine v0.19.2 (the workaround), non-reentrant with the v0.19.2
#     series, non-reentrant on pristine v0.19.8, and with its follow-up
#  2. the model without frozen parameters, paired blocks (scripts/bench_no_frozen_overhead.py), on
#     the CPU and on the GPU: v0.19.2 against its series, v0.19.8 against its follow-up
#  3. batch 16: the workaround against the series, one round each, while the time lasts
# One benchmark process at a time, pinned to cores 0-3: a CPU benchmark running beside a GPU one
# slowed the GPU one's host-bound step by up to 2x on the H200 host.
#
# Usage: scripts/gpu-perf-ws1.sh TREES OUT
#   TREES holds v0192-pristine, v0192-series, v0198-pristine, v0198-followup: each a deepspeed/ and
#   op_builder/ copied from scripts/apply.sh's checkouts (put first on PYTHONPATH, not installed).
#   OUT receives one results.tgz (bench/*.json, the pair outputs *.txt, device.txt).
# Environment: ZERO3_SITE, a directory of DeepSpeed requirements the host lacks, put on PYTHONPATH
#   after the tree (default /tmp/site); ZERO3_PERF_BUDGET, seconds for all of it (default 560).
# The reports: scripts/bench_lifecycle.py --report over bench/*.json; the pair outputs are read as they are.
set -uo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
trees=${1:?usage: scripts/gpu-perf-ws1.sh TREES OUT}
out=${2:?usage: scripts/gpu-perf-ws1.sh TREES OUT}
for t in v0192-pristine v0192-series v0198-pristine v0198-followup; do
    [[ -d $trees/$t/deepspeed ]] || { echo "gpu-perf-ws1.sh: $trees/$t has no deepspeed/ package" >&2; exit 2; }
done
site=${ZERO3_SITE:-/tmp/site}
budget=${ZERO3_PERF_BUDGET:-560}
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zero3-perf-ext}
start=$SECONDS
say() { echo "[$((SECONDS - start)) s] $*"; }
work=$(mktemp -d)
mkdir -p "$work/bench" "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"; } | tee "$work/device.txt"

bench() {  # bench BATCH VARIANT TREE ROUND
    local json=$work/bench/b$1-$3-$4.json
    PYTHONPATH=$trees/$3:$site taskset -c 0-3 timeout 90 python3 scripts/bench_lifecycle.py --variant "$2" \
        --world-size 1 --batch "$1" --steps 6 --warmup 3 --out "$json" >"${json%.json}.log" 2>&1
    say "batch $1, $3, round $4: exit $? $(python3 -c "import json; r = json.load(open('$json')); print('median step', round(r['step_s']['median'], 4), 's')" 2>/dev/null)"
}
pairs() {  # pairs ACCELERATOR NAME BASELINE=TREE OTHER=TREE
    local left=$((budget - (SECONDS - start)))
    ((left > 60)) || { say "$2: skipped, $left s left"; return; }
    PYTHONPATH=$site DS_ACCELERATOR=$1 taskset -c 0-3 timeout $((left < 130 ? left : 130)) python3 \
        scripts/bench_no_frozen_overhead.py --pairs 10 --block 4 --warmup 3 "$3" "$4" >"$work/$2.txt" 2>&1
    say "$2: exit $?"
}
for round in 1 2 3; do
    bench 4 reentrant v0192-pristine "$round"
    bench 4 series v0192-series "$round"
    bench 4 nonreentrant v0198-pristine "$round"
    bench 4 followup v0198-followup "$round"
done
pairs cpu cpu-nofrozen-v0192 "pristine=$trees/v0192-pristine" "series=$trees/v0192-series"
pairs cpu cpu-nofrozen-v0198 "pristine=$trees/v0198-pristine" "followup=$trees/v0198-followup"
pairs cuda gpu-nofrozen-v0192 "pristine=$trees/v0192-pristine" "series=$trees/v0192-series"
pairs cuda gpu-nofrozen-v0198 "pristine=$trees/v0198-pristine" "followup=$trees/v0198-followup"
for spec in reentrant:v0192-pristine series:v0192-series; do
    ((SECONDS - start < budget - 45)) && bench 16 "${spec%%:*}" "${spec#*:}" 1
done
tar -czf "$out/results.tgz" -C "$work" .
rm -rf -- "$work"
say "done: $out/results.tgz"
