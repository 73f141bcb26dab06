#!/usr/bin/env bash
# The benchmark of issue 6, all variants in one run, then the report the RFC includes:
#   series        v0.19.2 + the series, non-reentrant checkpointing on every decoder layer
#   reentrant     pristine v0.19.2 with use_reentrant=True (the downstream workaround)
#   no-ckpt       pristine v0.19.2 without checkpointing (the reference)
#   nocheck       pristine v0.19.2 non-reentrant with determinism_check="none" (the check that raises off)
#   minimal-skip  pristine v0.19.2 non-reentrant with PR 8130's minimal coordinator skip (emulated)
#   nonreentrant  pristine v0.19.2 non-reentrant: the crash this project fixes, reported as such
#                 (once); and the tree in $ZERO3_BENCH_UPSTREAM_TREE (e.g. an unpacked 0.19.8
#                 sdist), when set
#   followup      with ZERO3_BENCH_FOLLOWUP=VERSION (e.g. v0.19.8): that release + its follow-up series
#                 (patches/VERSION/), next to nonreentrant on that pristine release, in the same run;
#                 offline, give apply.sh the sdist with DEEPSPEED_SDIST
# ZERO3_BENCH_VARIANTS="no-ckpt nonreentrant followup" runs only those variants ("crash" names the
# crash run; default: all), so that a run fits a time limit; --report over several runs' JSON files
# puts them in one table.
# Every variant but the crash runs $ZERO3_BENCH_REPEATS times (default 2) as separate processes,
# interleaved, so that run-to-run spread shows; the first round also profiles one extra step.
# Usage: scripts/run-bench.sh [OUTDIR] [-- options for scripts/bench_lifecycle.py]. Run by
# `tox -e bench` on a host with 2 GPUs; writes OUTDIR/*.json and docs/_generated/bench.{md,png}
# (docs/_generated/bench-followup-VERSION.{md,png} with ZERO3_BENCH_FOLLOWUP).
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python}
out=${1:-build/bench}
shift || true
[[ ${1:-} == -- ]] && shift
repeats=${ZERO3_BENCH_REPEATS:-2}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "run-bench.sh: ZERO3_BENCH_REPEATS must be a positive integer, not '$repeats'" >&2; exit 2; }
mkdir -p "$out"
bash scripts/apply.sh v0.19.2 --dest build/deepspeed-v0.19.2-bench
bash scripts/apply.sh v0.19.2 --pristine --dest build/deepspeed-v0.19.2-bench-pristine
runs=("series=build/deepspeed-v0.19.2-bench" "reentrant=build/deepspeed-v0.19.2-bench-pristine"
      "no-ckpt=build/deepspeed-v0.19.2-bench-pristine" "nocheck=build/deepspeed-v0.19.2-bench-pristine"
      "minimal-skip=build/deepspeed-v0.19.2-bench-pristine")
if [[ -n ${ZERO3_BENCH_FOLLOWUP:-} ]]; then
    followup=$ZERO3_BENCH_FOLLOWUP
    [[ -f patches/$followup/series ]] || {
        echo "run-bench.sh: ZERO3_BENCH_FOLLOWUP=$followup has no series (patches/$followup/series)" >&2
        exit 2
    }
    bash scripts/apply.sh "$followup" --dest "build/deepspeed-$followup-bench"
    bash scripts/apply.sh "$followup" --pristine --dest "build/deepspeed-$followup-bench-pristine"
    runs+=("nonreentrant=build/deepspeed-$followup-bench-pristine" "followup=build/deepspeed-$followup-bench")
fi
if [[ -n ${ZERO3_BENCH_UPSTREAM_TREE:-} ]]; then
    [[ -d $ZERO3_BENCH_UPSTREAM_TREE/deepspeed ]] || {
        echo "run-bench.sh: ZERO3_BENCH_UPSTREAM_TREE=$ZERO3_BENCH_UPSTREAM_TREE holds no deepspeed/ package" >&2
        exit 2
    }
    runs+=("nonreentrant=$ZERO3_BENCH_UPSTREAM_TREE")
fi
selected=" ${ZERO3_BENCH_VARIANTS:-series reentrant no-ckpt nocheck minimal-skip nonreentrant followup crash} "
for name in $selected; do
    case $name in
        series | reentrant | no-ckpt | nocheck | minimal-skip | nonreentrant | followup | crash) ;;
        *) echo "run-bench.sh: ZERO3_BENCH_VARIANTS: unknown variant '$name'" >&2; exit 2 ;;
    esac
done
results=()
bench() {  # bench VARIANT TREE JSON [options]
    local variant=$1 tree=$2 json=$3
    shift 3
    echo "== $variant on $tree"
    PYTHONPATH=$(cd "$tree" && pwd) DS_BUILD_OPS=0 "$PYTHON" scripts/bench_lifecycle.py --variant "$variant" \
        --out "$json" "$@"
    results+=("$json")
}
for ((round = 1; round <= repeats; round++)); do
    profile=()
    ((round == 1)) && profile=(--profile)
    for run in "${runs[@]}"; do
        variant=${run%%=*}
        [[ $selected == *" $variant "* ]] || continue
        bench "$variant" "${run#*=}" "$out/$variant-$round.json" "${profile[@]}" "$@"
    done
    if ((round == 1)) && [[ $selected == *" crash "* ]]; then
        bench nonreentrant build/deepspeed-v0.19.2-bench-pristine "$out/pristine-nonreentrant.json" "$@"
    fi
done
# A follow-up run has its own report, so that the v0.19.2 table the RFC includes stays as recorded.
report=docs/_generated/bench${ZERO3_BENCH_FOLLOWUP:+-followup-$ZERO3_BENCH_FOLLOWUP}
"$PYTHON" scripts/bench_lifecycle.py --report "${results[@]}" --md "$report.md" --png "$report.png"
cat "$report.md"
