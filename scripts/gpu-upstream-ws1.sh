#!/usr/bin/env bash
# Upstream's ZeRO-3 + activation checkpointing tests on one GPU, pristine v0.19.8 against the
# follow-up, in one device call: tests/upstream_suite.py run --by-file on CUDA, world size 1, over
# upstream's lifecycle file (tests/unit/v1/zero/test_zero_activation_checkpoint_lifecycle.py), its
# z3-leaf file (tests/unit/runtime/zero/test_zero_leaf_module.py), both with the follow-up's tests
# in the follow-up's tree, and tests/unit/runtime/activation_checkpointing; then the diff.
# A test takes about 18 s on CUDA there (a process and a CUDA context each), so pytest-xdist
# spreads each file over workers when the host can import it (upstream's harness gives each
# worker its own port range); the trees run one after the other.
#
# Usage: scripts/gpu-upstream-ws1.sh PRISTINE FOLLOWUP OUT
#   PRISTINE, FOLLOWUP: DeepSpeed trees with their tests/ (scripts/apply.sh's v0.19.8 checkouts, or
#   a copy of their deepspeed/, op_builder/, accelerator/ and tests/). OUT receives the two result
#   directories (one JUnit report per file), the logs and device.txt.
# Environment: ZERO3_SITE, DeepSpeed requirements the host lacks (pytest-xdist among them), put on
#   PYTHONPATH (default /tmp/site); ZERO3_UPSTREAM_BUDGET, seconds for both trees (default 540);
#   ZERO3_WORKERS, xdist workers (default 10).
set -uo pipefail
usage="usage: scripts/gpu-upstream-ws1.sh PRISTINE FOLLOWUP OUT"
pristine=${1:?$usage}
followup=${2:?$usage}
out=${3:?$usage}
for tree in "$pristine" "$followup"; do
    [[ -f $tree/deepspeed/__init__.py && -f $tree/tests/unit/common.py ]] ||
        { echo "gpu-upstream-ws1.sh: $tree is not a DeepSpeed tree with upstream's tests/" >&2; exit 2; }
done
mkdir -p "$out"
# the paths as given, before moving to the repository root
pristine=$(cd "$pristine" && pwd) followup=$(cd "$followup" && pwd) out=$(cd "$out" && pwd)
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=${ZERO3_SITE:-/tmp/site} PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
    DS_BUILD_OPS=0 ZERO3_TEST_DEVICE=${ZERO3_TEST_DEVICE:-cuda}
budget=${ZERO3_UPSTREAM_BUDGET:-540}
start=$SECONDS
say() { echo "[$((SECONDS - start)) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  date -u; } | tee "$out/device.txt"
spread=()
if python3 -c "import xdist" 2>/dev/null; then
    spread=(-- -n "${ZERO3_WORKERS:-10}")
else
    say "pytest-xdist is not importable: one test at a time"
fi
paths=(unit/v1/zero/test_zero_activation_checkpoint_lifecycle.py unit/runtime/zero/test_zero_leaf_module.py
    unit/runtime/activation_checkpointing)
for role in pristine followup; do
    tree=$pristine
    [[ $role == followup ]] && tree=$followup
    # the first tree gets half of what is left, the second all of the rest, a third of it per file at
    # most (the runner stops a file's pytest at its timeout, or when timeout(1) stops the runner, and
    # keeps the tests that finished)
    left=$((budget - (SECONDS - start)))
    limit=$left
    [[ $role == pristine ]] && limit=$((left / 2))
    timeout -k 10 "$((limit + 30))" python3 -m tests.upstream_suite run --ranks 1 --by-file "$out/$role" \
        --file-timeout "$((limit / 3))" "$tree" "${paths[@]}" "${spread[@]}" >"$out/$role.log" 2>&1
    say "$role: exit $?"
    grep "^== " "$out/$role.log" | tail -6
done
python3 -m tests.upstream_suite diff "$out/pristine" "$out/followup" | tail -25
