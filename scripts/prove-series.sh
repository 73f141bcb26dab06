#!/usr/bin/env bash
# Bisect and necessity proof: for each prefix length N given (default: every prefix between
# pristine, which tox -e pristine proves, and the full series, which tox -e cpu runs), build DeepSpeed
# $ZERO3_VERSION (default v0.19.2) with the first N patches, install it into the current Python, and run the scenario suite with
# ZERO3_SERIES_PREFIX=N. There every test whose needs_patch(k) has k <= N must pass, and every test
# with k > N must see its scenario fail: so each prefix passes its own tests, and leaving out patch
# N+1 fails at least the tests that name it. Run by `tox -e bisect`; the full series is `tox -e cpu`,
# no patch at all is `tox -e pristine`.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python}
VERSION=${ZERO3_VERSION:-v0.19.2}
prefixes=("$@")
if ! ((${#prefixes[@]})); then
    # every prefix strictly between pristine and the whole fix series (the tests-only patch excluded)
    fixes=$(grep -cv -- '-tests-' "patches/$VERSION/series")
    for ((n = 1; n < fixes; n++)); do prefixes+=("$n"); done
fi
for n in "${prefixes[@]}"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "prove-series.sh: prefix length must be a number, got '$n'" >&2; exit 2; }
done
status=0
for n in "${prefixes[@]}"; do
    dest=build/deepspeed-$VERSION-p$n
    echo "== prefix $n: $dest"
    bash scripts/apply.sh "$VERSION" --patches "$n" --dest "$dest"
    "$PYTHON" -m pip install --quiet --no-build-isolation "$dest"
    if ! ZERO3_SERIES_PREFIX=$n "$PYTHON" -m pytest -q tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py; then
        echo "== prefix $n: FAILED" >&2
        status=1
    fi
done
exit $status
