#!/usr/bin/env bash
# Where one training step's time goes on one GPU, six variants, one process each
# (scripts/trace_step.py), then one Markdown table:
#   1-torch-reentrant      torch alone, use_reentrant=True
#   2-torch-nonreentrant   torch alone, use_reentrant=False
#   3-v0192-reentrant      DeepSpeed v0.19.2 pristine, use_reentrant=True (the workaround)
#   4-v0192-series         DeepSpeed v0.19.2 + patches/v0.19.2, use_reentrant=False
#   5-v0198-pristine       DeepSpeed v0.19.8 pristine, use_reentrant=False
#   6-v0198-followup       DeepSpeed v0.19.8 + patches/v0.19.8, use_reentrant=False
# The DeepSpeed trees are build/trace/ds-{v0192-pristine,v0192-series,v0198-pristine,v0198-followup}
# (a deepspeed/ and op_builder/ package copied from scripts/apply.sh's checkouts; put on
# PYTHONPATH, not installed). DeepSpeed requirements the GPU host lacks (hjson, pydantic, ...) are
# installed from build/trace/whl into /tmp/trace-site if the host python cannot import them.
#
# Usage: scripts/run-trace.sh OUTDIR [-- options for scripts/trace_step.py]
# Environment: ZERO3_TRACE_VARIANTS (labels to run, default all six), ZERO3_TRACE_BUDGET (seconds
# for all variants, default 490), ZERO3_TRACE_CAP (seconds at most per variant, default 160),
# PYTHON (default python3).
set -uo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
root=$PWD
out=${1:-build/trace-out}
shift || true
[[ ${1:-} == -- ]] && shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 DS_BUILD_OPS=0 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
budget=${ZERO3_TRACE_BUDGET:-490}
cap=${ZERO3_TRACE_CAP:-160}

site=
if ! "$PY" -c "import hjson, pydantic, msgpack, cpuinfo, ninja, einops, psutil" 2>/dev/null; then
    if compgen -G "build/trace/whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/trace-site \
            build/trace/whl/*.whl && site=/tmp/trace-site
    fi
fi
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv

runs=(
    "1-torch-reentrant torch-reentrant -"
    "2-torch-nonreentrant torch-nonreentrant -"
    "3-v0192-reentrant ds-reentrant build/trace/ds-v0192-pristine"
    "4-v0192-series ds-nonreentrant build/trace/ds-v0192-series"
    "5-v0198-pristine ds-nonreentrant build/trace/ds-v0198-pristine"
    "6-v0198-followup ds-nonreentrant build/trace/ds-v0198-followup"
)
selected=" ${ZERO3_TRACE_VARIANTS:-1-torch-reentrant 2-torch-nonreentrant 3-v0192-reentrant 4-v0192-series 5-v0198-pristine 6-v0198-followup} "
start=$SECONDS
for run in "${runs[@]}"; do
    read -r label variant tree <<<"$run"
    [[ $selected == *" $label "* ]] || continue
    left=$((budget - (SECONDS - start)))
    if ((left < 45)); then
        echo "== $label: skipped, $left s of the budget left"
        continue
    fi
    limit=$((left < cap ? left : cap))
    path=$site
    [[ $tree != - ]] && path=$root/$tree${site:+:$site}
    echo "== $label ($variant, ${tree/#-/no DeepSpeed}), limit $limit s, at $((SECONDS - start)) s"
    t0=$SECONDS
    PYTHONPATH=$path timeout -k 5 "$limit" "$PY" scripts/trace_step.py --variant "$variant" --label "$label" \
        --out "$out/trace_$label.json" "$@" 2>&1 | grep -v -E "FutureWarning|warnings.warn|return func\(\*args|^USDT"
    echo "== $label: rc ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
done
shopt -s nullglob
jsons=("$out"/trace_*.json)
if ((${#jsons[@]})); then
    "$PY" scripts/trace_step.py --report "${jsons[@]}" --md "$out/table.md"
else
    echo "no variant wrote its JSON"
    exit 1
fi
