#!/usr/bin/env bash
# Test a DeepSpeed fork that carries one of this repository's series: `tox -e fork -- /path/to/DeepSpeed`
# (docs/guide/forks.md). Run inside the tox environment, whose first command installed the test
# requirements into the current Python.
#
#   1. reads the fork's release from its version.txt (or ZERO3_VERSION) and counts the patches of
#      that release's series on its checked-out commit (by subject, as apply.sh --onto brings them);
#   2. installs the fork's committed HEAD from a shared clone in the tox environment (the fork
#      itself is never written to; uncommitted changes are not tested, and a warning says so);
#   3. runs the scenario suite against it (ZERO3_VERSION set, so tests/bases.py holds the base's
#      expectations) and the series' upstream-style tests through tests.upstream_compat.run, which
#      uses the fork's own tests/unit/common.py (DistributedTest) when the fork has one;
#   4. prints a summary to paste into a review, also written to $FORK_SUMMARY (default
#      <env>/fork-summary.txt).
# Exit status: 0 when every step passed, 1 when a test step failed, 2 for bad input.
set -Eeuo pipefail

PROG=test-fork.sh
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}
say() { printf '%s: %s\n' "$PROG" "$*"; }

(($# == 1)) || die "usage: tox -e fork -- /path/to/your/DeepSpeed (one path; got $# arguments)"
[[ -d $1 ]] || die "$1 is not a directory"
FORK=$(git -C "$1" rev-parse --show-toplevel 2>/dev/null) || die "$1 is not a git checkout of DeepSpeed"
[[ -d $FORK/deepspeed && -f $FORK/version.txt ]] || die "$FORK has no deepspeed/ or version.txt: not a DeepSpeed tree"
HEAD_ID=$(git -C "$FORK" rev-parse HEAD)
HEAD_NAME=$(git -C "$FORK" symbolic-ref -q --short HEAD || echo "detached HEAD")
RELEASE=v$(head -n 1 "$FORK/version.txt" | tr -d '[:space:]')
VERSION=${ZERO3_VERSION:-$RELEASE}
VERSION_FROM="version.txt: $RELEASE"
[[ -z ${ZERO3_VERSION:-} ]] || VERSION_FROM="ZERO3_VERSION; the fork's version.txt says $RELEASE"
SERIES_DIR=$ROOT/patches/$VERSION
[[ -f $SERIES_DIR/series ]] ||
    die "no series for $VERSION (the fork's version.txt says $RELEASE); series exist for: $(cd patches && ls -d v* | paste -sd' ' -). Set ZERO3_VERSION to the series the fork carries (docs/guide/forks.md: forks between releases)"

# The series' patches on the fork's commit, found by subject (a patch resolved by hand keeps it).
mapfile -t PATCHES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$SERIES_DIR/series")
subjects=$(git -C "$FORK" log --no-merges --format=%s HEAD)
found=0 missing=()
for p in "${PATCHES[@]}"; do
    # the Subject header, unfolded, without its [PATCH n/m]
    subject=$(awk '/^Subject: /{s=$0; sub(/^Subject: \[PATCH[^]]*\] /, "", s); while ((getline l) > 0 && l ~ /^ /) s = s l; print s; exit}' "$SERIES_DIR/$p")
    if grep -qxF -- "$subject" <<<"$subjects"; then found=$((found + 1)); else missing+=("$p"); fi
done
if ((found != ${#PATCHES[@]})) && [[ -z ${ZERO3_SERIES_PREFIX:-} ]]; then
    die "$FORK ($HEAD_NAME) carries $found of the ${#PATCHES[@]} patches of the $VERSION series; missing: ${missing[*]:0:3}$( ((${#missing[@]} > 3)) && echo ' ...'). Bring the series first (scripts/apply.sh $VERSION --onto BRANCH, run in the fork), or set ZERO3_SERIES_PREFIX=N to test a fork that carries the first N"
fi

ENV_DIR=$("$PY" -c 'import sys; print(sys.prefix)')
SUMMARY=${FORK_SUMMARY:-$ENV_DIR/fork-summary.txt}
dirty=$(git -C "$FORK" status --porcelain --untracked-files=no | wc -l)
((dirty == 0)) || printf '%s: warning: %s has %s uncommitted change(s); the committed HEAD %s is tested\n' \
    "$PROG" "$FORK" "$dirty" "${HEAD_ID:0:12}" >&2

# The fork's HEAD, in a clone of its own: pip builds inside the tree it installs.
TREE=$ENV_DIR/fork-tree
rm -rf -- "$TREE"
git clone -q --shared --no-checkout -- "$FORK" "$TREE"
git -C "$TREE" -c advice.detachedHead=false checkout -q "$HEAD_ID"
bash scripts/tox-step.sh deepspeed "$TREE"
export ZERO3_VERSION=$VERSION
say "TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-unset}"

# The upstream-style test files the series adds or changes (from its patches), run from the fork's tree.
mapfile -t UPSTREAM_TESTS < <(for p in "${PATCHES[@]}"; do sed -n 's|^+++ b/\(tests/unit/.*/test_[^/]*\.py\)$|\1|p' "$SERIES_DIR/$p"; done | sort -u)

SCENARIOS=(tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py)
[[ $VERSION != v0.19.8 ]] || SCENARIOS+=(tests/test_v0198.py)
results=() status=0
# step NAME COMMAND...: run it, keep pytest's closing line and the time
step() {
    local name=$1 log start rc last
    shift
    log=$ENV_DIR/fork-$name.log
    start=$SECONDS
    say "$name: $*"
    set +e
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    last=$(grep -E '^=*.* in [0-9.]+s' "$log" | tail -n 1 | sed -e 's/^=* *//' -e 's/ *=*$//')
    results+=("$(printf '%-18s %-4s %s (%s s; log %s)' "$name" "$( ((rc == 0)) && echo PASS || echo FAIL)" \
        "${last:-no pytest summary, exit $rc}" "$((SECONDS - start))" "$log")")
    ((rc == 0)) || status=1
}
step scenarios "$PY" -m pytest -q -p no:cacheprovider "${SCENARIOS[@]}"
if ((${#UPSTREAM_TESTS[@]})); then
    step upstream-style "$PY" -m tests.upstream_compat.run "$TREE" -q "${UPSTREAM_TESTS[@]}"
fi

harness="this repository's stand-in (tests/upstream_compat)"
[[ ! -f $TREE/tests/unit/common.py ]] || harness="the fork's own tests/unit/common.py"
{
    printf 'ZeRO-3 series check of a DeepSpeed fork (%s, %s)\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)"
    printf '  fork:         %s, %s at %s%s\n' "$FORK" "$HEAD_NAME" "${HEAD_ID:0:12}" \
        "$( ((dirty == 0)) || echo " ($dirty uncommitted change(s) not tested)")"
    printf '  base:         %s (%s)\n' "$VERSION" "$VERSION_FROM"
    printf '  series:       %s of %s patches of patches/%s found on HEAD%s\n' "$found" "${#PATCHES[@]}" "$VERSION" \
        "${ZERO3_SERIES_PREFIX:+ (testing as prefix $ZERO3_SERIES_PREFIX)}"
    printf '  this repo:    %s%s\n' "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')" \
        "$([[ -z $(git -C "$ROOT" status --porcelain -- patches tests scripts 2>/dev/null) ]] ||
            echo ' with uncommitted changes in patches/, tests/ or scripts/')"
    printf '  stack:        %s\n' "$("$PY" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "deepspeed", "transformers", "peft")))')"
    printf '  device:       %s (DS_ACCELERATOR=%s), TORCH_EXTENSIONS_DIR=%s\n' "${ZERO3_TEST_DEVICE:-cpu}" \
        "${DS_ACCELERATOR:-unset}" "${TORCH_EXTENSIONS_DIR:-unset}"
    printf '  upstream-style tests: %s files, run through %s\n' "${#UPSTREAM_TESTS[@]}" "$harness"
    printf '  %s\n' "${results[@]}"
    printf '  result:       %s\n' "$( ((status == 0)) && echo PASS || echo FAIL)"
} | tee "$SUMMARY"
say "summary written to $SUMMARY"
exit $status
