#!/usr/bin/env bash
# Bisect and necessity proof: for each prefix length N given (default: every prefix between
# pristine, which tox -e pristine proves, and the full series, which tox -e cpu runs), build DeepSpeed
# $ZERO3_VERSION (default v0.19.2) with the first N patches, install it into the current Python, and run
# the scenario tests of patch N (needs_patch(N): they must pass), of patch N+1 (their scenarios must
# fail: that patch is needed) and the guards (needs_patch(0)), with ZERO3_SERIES_PREFIX=N and
# ZERO3_PREFIX_PROOF=1 (tests/bases.py leaves the other tests out). So each patch is enough for its
# tests on top of the ones before it, and necessary for them. Run by `tox -e bisect`; the full
# series, every test, is `tox -e cpu`; no patch at all is `tox -e pristine`.
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
# install PREFIX_TREE: the first prefix is pip-installed; a later one only copies over the installed
# package the files that it or the prefix installed before it changes (building DeepSpeed again, most
# of a prefix's time, would give the same files), unless one of them adds, removes or changes anything
# but Python files under deepspeed/.
package='' installed_changes=''
install() {
    local dest=$1 base changed both
    base=$(git -C "$dest" config --get "branch.zero3/$VERSION.zero3base")
    changed=$(git -C "$dest" diff --name-only --no-renames "$base" HEAD -- deepspeed)
    # a file only the previous prefix changed is copied back as it is in this tree: unchanged
    both=$(printf '%s\n%s\n' "$changed" "$installed_changes" | sed '/^$/d' | sort -u)
    if [[ -n $package && -z $(git -C "$dest" diff --name-only --no-renames --diff-filter=ADRT "$base" HEAD -- deepspeed) ]] &&
        ! grep -qv '\.py$' <<<"$both"; then
        while read -r f; do
            [[ -z $f ]] || cp -- "$dest/$f" "$package/${f#deepspeed/}"
        done <<<"$both"
        echo "== copied the files the prefix changes into $package"
    else
        "$PYTHON" -m pip install --quiet --no-build-isolation "$dest"
        package=$("$PYTHON" -c 'import deepspeed, os; print(os.path.dirname(deepspeed.__file__))')
    fi
    installed_changes=$changed
}
status=0
for n in "${prefixes[@]}"; do
    dest=build/deepspeed-$VERSION-p$n
    echo "== prefix $n: $dest"
    bash scripts/apply.sh "$VERSION" --patches "$n" --dest "$dest"
    install "$dest"
    if ! ZERO3_PREFIX_PROOF=1 ZERO3_SERIES_PREFIX=$n "$PYTHON" -m pytest -q tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py; then
        echo "== prefix $n: FAILED" >&2
        status=1
    fi
done
exit $status
