#!/usr/bin/env bash
# The paired step-time benchmark of one GPU host, world size 1, in one device call (about 6 minutes):
#  1. Llama 16 x 2048 + PEFT LoRA, batch 4: the reentrant workaround on pristine v0.19.2 against
#     non-reentrant checkpointing with the v0.19.2 series, two long-lived processes taking turns
#     (scripts/bench_lifecycle.py --pair, 12 pairs of 3-step blocks)
#  2. torch alone, reentrant and non-reentrant (scripts/trace_step.py): torch's own ratio
#  3. the same pair at batch 16 (5 pairs of 2-step blocks)
#  4. the model without frozen parameters, paired blocks (scripts/bench_no_frozen_overhead.py), on the
#     GPU, then on the host's CPU, while the time lasts
# One benchmark process (or pair) at a time, pinned to cores 0-3.
#
# Usage: scripts/gpu-pair-ws1.sh TREES OUT
#   TREES holds v0192-pristine and v0192-series: each a deepspeed/ and op_builder/ copied from
#   scripts/apply.sh's checkouts (put first on PYTHONPATH, not installed). OUT receives pair.tgz
#   (the outputs *.txt, the pairs' and torch runs' *.json, device.txt).
# Environment: ZERO3_SITE, a directory of DeepSpeed requirements the host lacks, put on PYTHONPATH
#   after the tree (default /tmp/site); ZERO3_PERF_BUDGET, seconds for all of it (default 560).
set -uo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
trees=${1:?usage: scripts/gpu-pair-ws1.sh TREES OUT}
out=${2:?usage: scripts/gpu-pair-ws1.sh TREES OUT}
for t in v0192-pristine v0192-series; do
    [[ -d $trees/$t/deepspeed ]] || { echo "gpu-pair-ws1.sh: $trees/$t has no deepspeed/ package" >&2; exit 2; }
done
trees=$(cd "$trees" && pwd)
export PYTHONPATH=${ZERO3_SITE:-/tmp/site} PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
    DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zero3-perf-ext}
budget=${ZERO3_PERF_BUDGET:-560}
start=$SECONDS
say() { echo "[$((SECONDS - start)) s] $*"; }
left() { echo $((budget - (SECONDS - start))); }
work=$(mktemp -d)
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  lscpu | grep -E "^(Model name|CPU\(s\))"; date -u; } | tee "$work/device.txt"

pair() {  # pair NAME BATCH PAIRS BLOCK BASELINE OTHER
    (($(left) > 70)) || { say "$1: skipped, $(left) s left"; return; }
    taskset -c 0-3 timeout $(($(left) < 200 ? $(left) : 200)) python3 scripts/bench_lifecycle.py --pair "$5" "$6" \
        --batch "$2" --pairs "$3" --block "$4" --warmup 3 --out "$work/$1.json" >"$work/$1.txt" 2>&1
    say "$1: exit $?"
    grep -E "ratios|^[a-z]+: " "$work/$1.txt"
}
torch_alone() {  # torch_alone VARIANT
    (($(left) > 60)) || { say "$1: skipped, $(left) s left"; return; }
    taskset -c 0-3 timeout 120 python3 scripts/trace_step.py --variant "$1" --label "$1" --steps 8 --profile-steps 1 \
        --no-cprofile --out "$work/floor-$1.json" >"$work/floor-$1.log" 2>&1
    say "$1: exit $?"
    grep "step times" "$work/floor-$1.log"
}
no_frozen() {  # no_frozen ACCELERATOR NAME
    (($(left) > 80)) || { say "$2: skipped, $(left) s left"; return; }
    DS_ACCELERATOR=$1 taskset -c 0-3 timeout $(($(left) < 150 ? $(left) : 150)) python3 \
        scripts/bench_no_frozen_overhead.py --pairs 10 --block 4 --warmup 3 \
        "pristine=$trees/v0192-pristine" "series=$trees/v0192-series" >"$work/$2.txt" 2>&1
    say "$2: exit $?"
    grep -E "per pair|ratios" "$work/$2.txt"
}
workaround=reentrant@$trees/v0192-pristine
series=series@$trees/v0192-series
pair b4-workaround-series 4 12 3 "workaround=$workaround" "series=$series"
torch_alone torch-reentrant
torch_alone torch-nonreentrant
pair b16-workaround-series 16 5 2 "workaround=$workaround" "series=$series"
no_frozen cuda gpu-nofrozen-v0192
no_frozen cpu cpu-nofrozen-v0192
tar -czf "$out/pair.tgz" -C "$work" .
rm -rf -- "$work"
say "done: $out/pair.tgz"
