#!/usr/bin/env bash
# On a CUDA host without network: the real-QLoRA and TRL tests (tests/test_qlora_trl.py) on pristine
# DeepSpeed v0.19.2 and on the series, with TRL 1.16.0 as released and with integrations/trl's
# patch, then one table of the outcomes. See --help.
set -Eeuo pipefail

PROG=scripts/gpu-qlora-trl.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/gpu-qlora-trl.sh [--wheels DIR] [--work DIR] [--out DIR] [--serial] [--device cuda|cpu]

Runs tests/test_qlora_trl.py on one GPU in four configurations:
  DeepSpeed v0.19.2 pristine (ZERO3_SERIES_PREFIX=0) or with the series, each with
  TRL 1.16.0 as released (both tests) or with integrations/trl's patch (the TRL test),
and prints a table: each test's outcome (on pristine a pass means it failed as it must, with the
CheckpointError) and, on the series, the losses of both checkpointing modes.

  --wheels DIR  what scripts/build-wheelhouse.sh --qlora-trl made (default: wheelhouse/qlora-trl):
                the wheels the host lacks, installed with --no-deps into WORK/site, and the
                DeepSpeed and TRL sdists
  --work DIR    trees, installs, logs (default: /tmp/zero3-qlora-trl; made anew each run)
  --out DIR     also copy the table and a tarball of the logs there
  --serial      one configuration at a time (default: all four at once; the models are tiny)
  --device cpu  try the script on a machine without a GPU: everything runs but the tests, which
                skip there (default: cuda)

The Python is $ZERO3_HOST_PYTHON, else python3: it must have CUDA torch, transformers, peft,
accelerate, pytest, setuptools and wheel. DeepSpeed is built from scripts/apply.sh's trees
(build/deepspeed-v0.19.2-qlora-trl{,-pristine}) with DS_BUILD_OPS=0. Exit status: 0 when every
configuration's pytest passed, 1 otherwise, 2 for a bad command line.

Getting the set there within a 64 MiB transfer: bitsandbytes alone is about 43 MB, so copy
wheelhouse/qlora-trl (about 48 MiB) without the rest of the wheelhouse.
EOF
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}
fail() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

WHEELS=$REPO_ROOT/wheelhouse/qlora-trl WORK=/tmp/zero3-qlora-trl OUTDIR='' SERIAL=0 DEVICE=cuda
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --serial) SERIAL=1 ;;
        --wheels | --work | --out | --device)
            if (($# < 2)) || [[ -z $2 ]]; then die "option $1 needs a value"; fi
            case $1 in
                --device) DEVICE=$2 ;;
                --wheels) WHEELS=$2 ;;
                --work) WORK=$2 ;;
                --out) OUTDIR=$2 ;;
            esac
            shift
            ;;
        *) die "unexpected argument '$1' (see --help)" ;;
    esac
    shift
done
[[ $DEVICE == cuda || $DEVICE == cpu ]] || die "--device takes cuda or cpu, not '$DEVICE'"
[[ -d $WHEELS ]] || die "--wheels: no directory $WHEELS (run scripts/build-wheelhouse.sh --qlora-trl)"
WHEELS=$(cd -- "$WHEELS" && pwd -P)
compgen -G "$WHEELS/bitsandbytes-*.whl" >/dev/null || die "$WHEELS has no bitsandbytes wheel: not a --qlora-trl set"
compgen -G "$WHEELS/deepspeed-*.tar.gz" >/dev/null || die "$WHEELS has no DeepSpeed sdist: not a --qlora-trl set"
# both relative to where the script was started, which it leaves for the repository root
WORK=$(realpath -m -- "$WORK")
[[ -z $OUTDIR ]] || OUTDIR=$(realpath -m -- "$OUTDIR")
[[ $WORK != / ]] || die "--work / is not allowed"
py=${ZERO3_HOST_PYTHON:-python3}
cd -- "$REPO_ROOT"

step() { printf '== %s\n' "$*"; }
# WORK is replaced on every run, but only a directory this script made (its marker file) or none
if [[ -e $WORK && ! -e $WORK/.gpu-qlora-trl ]] && [[ -n $(ls -A -- "$WORK" 2>/dev/null) ]]; then
    die "--work $WORK exists and was not made by this script; give another directory"
fi
rm -rf -- "$WORK"
mkdir -p -- "$WORK/logs"
touch -- "$WORK/.gpu-qlora-trl"

# Nothing is downloaded: fail at once instead of waiting for a hub that cannot be reached.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
step "host: $("$py" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__,
                                                  "cuda", torch.cuda.is_available())')"
step "installing the carried wheels into $WORK/site"
"$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --target "$WORK/site" \
    "$WHEELS"/*.whl

step "DeepSpeed v0.19.2 trees (pristine and the series) and their installs"
export DEEPSPEED_SDIST=$WHEELS
declare -A TREE=([pristine]=build/deepspeed-v0.19.2-qlora-trl-pristine [series]=build/deepspeed-v0.19.2-qlora-trl)
bash scripts/apply.sh v0.19.2 --source sdist --pristine --dest "${TREE[pristine]}" \
    >"$WORK/logs/apply-pristine.log" 2>&1 ||
    { cat "$WORK/logs/apply-pristine.log"; fail "scripts/apply.sh --pristine failed (its output above)"; }
bash scripts/apply.sh v0.19.2 --source sdist --dest "${TREE[series]}" >"$WORK/logs/apply-series.log" 2>&1 ||
    { cat "$WORK/logs/apply-series.log"; fail "scripts/apply.sh failed (its output above)"; }
pids=()
for ds in pristine series; do
    DS_BUILD_OPS=0 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} "$py" -m pip install --quiet \
        --disable-pip-version-check --no-index --no-deps --no-build-isolation --target "$WORK/ds-$ds" \
        "${TREE[$ds]}" >"$WORK/logs/install-$ds.log" 2>&1 &
    pids+=($!)
done
for i in 0 1; do
    wait "${pids[$i]}" || { cat "$WORK"/logs/install-*.log; fail "installing a DeepSpeed tree failed (logs above)"; }
done

step "TRL 1.16.0 with integrations/trl's patch (its own test runs on the way)"
bash integrations/trl/check.sh --sdist "$WHEELS" --dest "$WORK/trl-patched" --python "$py"

# configuration -> DeepSpeed, TRL, pytest selection
CONFIGS=(pristine-released series-released pristine-patched series-patched)
run_config() {
    local config=$1 ds=${1%-*} trl=${1#*-} path prefix=() select=()
    path=$WORK/ds-$ds:$WORK/site
    [[ $trl == patched ]] && path=$WORK/trl-patched:$path && select=(-k test_trl_sft_trainer)
    # The series tree: no ZERO3_SERIES_PREFIX, so the tests take the whole series as applied
    [[ $ds == pristine ]] && prefix=(ZERO3_SERIES_PREFIX=0)
    env "${prefix[@]}" PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} ZERO3_TEST_DEVICE=$DEVICE \
        DS_ACCELERATOR=$DEVICE ZERO3_RESULTS_FILE=$WORK/logs/results-$config.jsonl PYTHONDONTWRITEBYTECODE=1 \
        ZERO3_TEST_LOG_DIR=$WORK/logs/ranks-$config \
        "$py" -m pytest -p no:cacheprovider -q -rA -s "${select[@]}" tests/test_qlora_trl.py \
        >"$WORK/logs/pytest-$config.log" 2>&1
}
preflight() {
    local config=$1 ds=${1%-*} trl=${1#*-} path
    path=$WORK/ds-$ds:$WORK/site
    [[ $trl == patched ]] && path=$WORK/trl-patched:$path
    PYTHONPATH=$path DS_ACCELERATOR=$DEVICE "$py" - "$config" <<'PY'
import sys
import bitsandbytes, datasets, deepspeed, peft, transformers, trl
from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator
from trl import import_utils
gate = getattr(import_utils, "is_deepspeed_zero3_non_reentrant_checkpointing_supported", None)
print(f"   {sys.argv[1]:17} deepspeed {deepspeed.__version__} ({deepspeed.__file__.rsplit('/', 2)[0]}), "
      f"series function: {hasattr(coordinator, 'in_backward_graph_task')}; trl {trl.__version__} "
      f"({trl.__file__.rsplit('/', 2)[0]}), gate: {'absent' if gate is None else gate()}; "
      f"bitsandbytes {bitsandbytes.__version__}, datasets {datasets.__version__}, "
      f"transformers {transformers.__version__}, peft {peft.__version__}")
PY
}
step "what each configuration imports"
declare -A IMPORTS
for config in "${CONFIGS[@]}"; do
    preflight "$config" >"$WORK/logs/imports-$config.txt" 2>&1 &
    IMPORTS[$config]=$!
done
for config in "${CONFIGS[@]}"; do
    if wait "${IMPORTS[$config]}"; then
        grep '^   ' "$WORK/logs/imports-$config.txt"
    else
        cat "$WORK/logs/imports-$config.txt"
        fail "$config: the imports above failed"
    fi
done

step "tests/test_qlora_trl.py in ${#CONFIGS[@]} configurations ($( ((SERIAL)) && echo serial || echo parallel))"
declare -A STATUS
if ((SERIAL)); then
    for config in "${CONFIGS[@]}"; do
        if run_config "$config"; then STATUS[$config]=0; else STATUS[$config]=$?; fi
    done
else
    declare -A PID
    for config in "${CONFIGS[@]}"; do
        run_config "$config" &
        PID[$config]=$!
    done
    for config in "${CONFIGS[@]}"; do
        if wait "${PID[$config]}"; then STATUS[$config]=0; else STATUS[$config]=$?; fi
    done
fi

table=$WORK/summary.txt
{
    printf '%-18s %-4s %-48s %s\n' configuration rc test outcome
    for config in "${CONFIGS[@]}"; do
        "$py" - "$config" "${STATUS[$config]}" "$WORK/logs/results-$config.jsonl" "$WORK/logs/pytest-$config.log" <<'PY'
import json, os, re, sys
config, rc, results, log = sys.argv[1:]
rows = [json.loads(line) for line in open(results)] if os.path.exists(results) else []
text = open(log).read()
for row in rows:
    name = row["test"].split("::")[-1]
    losses = re.search(rf"^{re.escape(name)} losses: (.*)$", text, re.M)
    detail = row["failure"][:110] if row["failure"] else (losses.group(1) if losses else "")
    print(f"{config:18} {rc:4} {name:48} {row['outcome']}  {detail}")
if not rows:
    print(f"{config:18} {rc:4} {'(no result recorded)':48} {text.strip().splitlines()[-1] if text.strip() else ''}")
PY
    done
} | tee "$table"
failed=0
for config in "${CONFIGS[@]}"; do
    if ((STATUS[$config] != 0)); then
        failed=1
        echo "-- $config: pytest exited ${STATUS[$config]}; the end of $WORK/logs/pytest-$config.log:"
        tail -n 40 "$WORK/logs/pytest-$config.log"
    fi
    # on a GPU a skipped test is a failure of this script: it exists to run them
    expected=2
    [[ $config == *-patched ]] && expected=1
    recorded=0
    if [[ -f $WORK/logs/results-$config.jsonl ]]; then recorded=$(wc -l <"$WORK/logs/results-$config.jsonl"); fi
    if [[ $DEVICE == cuda ]] && ((recorded != expected)); then
        failed=1
        echo "-- $config: $recorded of $expected tests recorded a result (skipped?): see $WORK/logs/pytest-$config.log"
    fi
done
if [[ -n $OUTDIR ]]; then
    mkdir -p -- "$OUTDIR"
    cp -- "$table" "$OUTDIR/qlora-trl-summary.txt"
    tar czf "$OUTDIR/qlora-trl-logs.tar.gz" -C "$WORK" logs summary.txt
    echo "$PROG: wrote $OUTDIR/qlora-trl-summary.txt and $OUTDIR/qlora-trl-logs.tar.gz"
fi
exit "$failed"
