#!/usr/bin/env bash
# Bisect and necessity proof: for each prefix length N given (default: every prefix between
# pristine, which tox -e pristine proves, and the full series, which tox -e cpu runs), build DeepSpeed
# $ZERO3_VERSION (default v0.19.2) with the first N patches, install it into the current Python, and run
# the scenario tests of patch N (needs_patch(N): they must pass), of patch N+1 (their scenarios must
# fail: that patch is needed) and the guards (needs_patch(0)), with ZERO3_SERIES_PREFIX=N and
# ZERO3_PREFIX_PROOF=1 (tests/bases.py leaves the other tests out). So each patch is enough for its
# tests on top of the ones before it, and necessary for them. Run by `tox -e bisect`; the full
# series, every test, is `tox -e cpu`; no patch at all is `tox -e pristine`.
#
# On a fork (docs/guide/forks.md): scripts/prove-series.sh --fork /path/to/DeepSpeed RANGE [--dry-run]
# proves each commit of the fork's RANGE (e.g. v0.19.2..internal, as git rev-list takes it) the same
# way: the commit's prefix N is the number of the series' patches its history carries (by subject, as
# apply.sh --onto brings them; they must be the first N), and the commit must pass what prefix N
# passes (the whole scenario suite when N is the whole series). The fork's own commits between the
# series' patches are proven with the prefix below them. Each commit is installed from one shared clone
# under build/ (the fork is not written to); --dry-run prints the plan and installs nothing. The
# release is ZERO3_VERSION, else the version.txt of RANGE's last commit.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python}
if [[ ${1:-} == --fork ]]; then
    FORK_MODE=1
else
    FORK_MODE=0
fi
VERSION=${ZERO3_VERSION:-v0.19.2}
((FORK_MODE)) || prefixes=("$@")
if ((!FORK_MODE)) && ! ((${#prefixes[@]})); then
    # every prefix strictly between pristine and the whole fix series (the tests-only patch excluded)
    fixes=$(grep -cv -- '-tests-' "patches/$VERSION/series")
    for ((n = 1; n < fixes; n++)); do prefixes+=("$n"); done
fi
((FORK_MODE)) || for n in "${prefixes[@]}"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "prove-series.sh: prefix length must be a number, got '$n'" >&2; exit 2; }
done
# install PREFIX_TREE: the first prefix is pip-installed; a later one only copies over the installed
# package the files that it or the prefix installed before it changes (building DeepSpeed again, most
# of a prefix's time, would give the same files), unless one of them adds, removes or changes anything
# but Python files under deepspeed/.
package='' installed_changes=''
install() {
    local dest=$1 base=${2:-} changed both
    [[ -n $base ]] || base=$(git -C "$dest" config --get "branch.zero3/$VERSION.zero3base")
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
# prove_fork FORK RANGE [--dry-run]
prove_fork() {
    local fork range dry=0 tip series subjects=() have n i ok commit results=() status=0 tree start
    (($# >= 2)) || { echo "prove-series.sh: usage: prove-series.sh --fork /path/to/DeepSpeed RANGE [--dry-run]" >&2; return 2; }
    fork=$(git -C "$1" rev-parse --show-toplevel 2>/dev/null) || { echo "prove-series.sh: $1 is not a git checkout" >&2; return 2; }
    range=$2
    [[ ${3:-} != --dry-run ]] || dry=1
    mapfile -t commits < <(git -C "$fork" rev-list --reverse "$range" 2>/dev/null)
    ((${#commits[@]})) || { echo "prove-series.sh: no commits in $range of $fork (git rev-list $range)" >&2; return 2; }
    tip=${commits[-1]}
    if [[ -z ${ZERO3_VERSION:-} ]]; then
        VERSION=v$(git -C "$fork" show "$tip:version.txt" | head -n 1 | tr -d '[:space:]')
    fi
    series=patches/$VERSION/series
    [[ -f $series ]] || { echo "prove-series.sh: no series $series for the fork's release; set ZERO3_VERSION" >&2; return 2; }
    for p in $(sed -e 's/#.*//' "$series"); do
        subjects+=("$(awk '/^Subject: /{s=$0; sub(/^Subject: \[PATCH[^]]*\] /, "", s); while ((getline l) > 0 && l ~ /^ /) s = s l; print s; exit}' "patches/$VERSION/$p")")
    done
    echo "== $fork: ${#commits[@]} commit(s) of $range against the $VERSION series (${#subjects[@]} patches)"
    tree=build/prove-fork-$VERSION
    if ((!dry)); then
        rm -rf -- "$tree"
        git clone -q --shared --no-checkout -- "$fork" "$tree"
    fi
    for commit in "${commits[@]}"; do
        have=$(git -C "$fork" log --no-merges --format=%s "$commit")
        n=0 ok=1
        for ((i = 0; i < ${#subjects[@]}; i++)); do
            if grep -qxF -- "${subjects[i]}" <<<"$have"; then
                ((n == i)) || ok=0
                n=$((i + 1))
            fi
        done
        line="$(git -C "$fork" log -1 --format='%h %s' "$commit")"
        if ((!ok)); then
            echo "== $line: FAILED: its history carries patches of the series that are not a prefix (the last is $n); prove what a fork carries only as a prefix" >&2
            results+=("FAIL  not a prefix   $line")
            status=1
            continue
        fi
        local proof="prefix $n: the tests of patches $n and $((n + 1)) and the guards"
        ((n != ${#subjects[@]})) || proof="the whole series: every scenario test"
        echo "== $line: $proof"
        ((!dry)) || continue
        start=$SECONDS
        git -C "$tree" -c advice.detachedHead=false checkout -q --force "$commit"
        install "$tree" "${commits[0]}^"
        if ((n == ${#subjects[@]})); then
            ZERO3_VERSION=$VERSION "$PYTHON" -m pytest -q tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py && ok=1 || ok=0
        else
            ZERO3_VERSION=$VERSION ZERO3_PREFIX_PROOF=1 ZERO3_SERIES_PREFIX=$n "$PYTHON" -m pytest -q tests/test_frozen_ckpt.py \
                tests/test_hf_llama_peft.py && ok=1 || ok=0
        fi
        results+=("$( ((ok)) && echo PASS || echo FAIL)  prefix $(printf '%-6s' "$n")  $line  ($((SECONDS - start)) s)")
        ((ok)) || status=1
    done
    ((${#results[@]} == 0)) || printf '== %s\n' "summary of $range ($VERSION):" "${results[@]}"
    return $status
}
if ((FORK_MODE)); then
    prove_fork "${@:2}"
    exit $?
fi
status=0
rows=()  # one table row per prefix, for the record below
for n in "${prefixes[@]}"; do
    dest=build/deepspeed-$VERSION-p$n
    echo "== prefix $n: $dest"
    start=$SECONDS
    bash scripts/apply.sh "$VERSION" --patches "$n" --dest "$dest"
    install "$dest"
    log=$dest.pytest.log
    ZERO3_PREFIX_PROOF=1 ZERO3_SERIES_PREFIX=$n "$PYTHON" -m pytest -q -p no:cacheprovider \
        tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py 2>&1 | tee "$log"
    proof=ok
    if ((PIPESTATUS[0])); then
        echo "== prefix $n: FAILED" >&2
        status=1 proof=FAILED
    fi
    patch=$(sed -n "${n}p" "patches/$VERSION/series")
    subject=$("$PYTHON" -c 'import email, re, sys
print(re.sub(r"^\[PATCH[^]]*\] ", "", " ".join(email.message_from_file(open(sys.argv[1]))["Subject"].split())))' \
        "patches/$VERSION/$patch")
    outcome=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
    rows+=("| $n | ${subject//|/\\|} | $proof | $outcome | $((SECONDS - start)) |")
done
# Every prefix proven (the default): the record CI checks instead of running this again
# (docs/_generated/bisect-VERSION.md, stamped with the series it proved; the docs build fails once the
# series changes and the record is not made again).
if ((status == 0 && ${#@} == 0)); then
    record=docs/_generated/bisect-$VERSION.md
    torch=$("$PYTHON" -c 'import torch; print(torch.__version__)')
    {
        echo "Each prefix of the $VERSION series, proven by \`scripts/prove-series.sh\` (\`tox -e bisect\`) on"
        echo "$(date -u +%Y-%m-%d), CPU, torch $torch, world size ${ZERO3_WORLD_SIZE:-2}: with the first N patches the"
        echo "tests of patch N and the guards pass, and the scenarios of patch N+1 still fail (so patch N+1 is"
        echo "needed). The whole series is \`tox -e cpu\`; no patch at all is \`tox -e pristine\`."
        echo
        echo "| N | patch N | proof | pytest | seconds |"
        echo "|---|---|---|---|---|"
        printf '%s\n' "${rows[@]}"
    } >"$record"
    "$PYTHON" scripts/stamp-generated.py --series "$VERSION" --deepspeed "${VERSION#v}" \
        --trees "$VERSION + patches 1 to ${prefixes[-1]}" --command "tox -e bisect" "$record"
fi
exit $status
