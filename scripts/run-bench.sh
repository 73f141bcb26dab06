#!/usr/bin/env bash
# The benchmark of issue 6, all variants in one run, then the report the RFC includes:
#   series     v0.19.2 + the series, non-reentrant checkpointing on every decoder layer
#   reentrant  pristine v0.19.2 with use_reentrant=True (the downstream workaround)
#   no-ckpt    pristine v0.19.2 without checkpointing (the reference)
#   upstream   non-reentrant on the tree in $ZERO3_BENCH_UPSTREAM_TREE (e.g. an unpacked 0.19.8
#              sdist), when set
# Usage: scripts/run-bench.sh [OUTDIR] [-- options for scripts/bench_lifecycle.py]. Run by
# `tox -e bench` on a host with 2 GPUs; writes OUTDIR/*.json and docs/_generated/bench.{md,png}.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python}
out=${1:-build/bench}
shift || true
[[ ${1:-} == -- ]] && shift
mkdir -p "$out"
bash scripts/apply.sh v0.19.2 --dest build/deepspeed-v0.19.2-bench
bash scripts/apply.sh v0.19.2 --pristine --dest build/deepspeed-v0.19.2-bench-pristine
runs=("series=build/deepspeed-v0.19.2-bench" "reentrant=build/deepspeed-v0.19.2-bench-pristine"
      "no-ckpt=build/deepspeed-v0.19.2-bench-pristine")
if [[ -n ${ZERO3_BENCH_UPSTREAM_TREE:-} ]]; then
    runs+=("nonreentrant=$ZERO3_BENCH_UPSTREAM_TREE")
fi
results=()
for run in "${runs[@]}"; do
    variant=${run%%=*}
    tree=${run#*=}
    echo "== $variant on $tree"
    PYTHONPATH=$PWD/$tree DS_BUILD_OPS=0 "$PYTHON" scripts/bench_lifecycle.py --variant "$variant" \
        --out "$out/$variant.json" "$@"
    results+=("$out/$variant.json")
done
"$PYTHON" scripts/bench_lifecycle.py --report "${results[@]}" --md docs/_generated/bench.md \
    --png docs/_generated/bench.png
cat docs/_generated/bench.md
