#!/usr/bin/env bash
# Independence proof for a series of independent upstream PRs (the v0.19.8 follow-up): each patch of
# patches/VERSION/series must apply ALONE on the pristine release with `git am`, and, with --test,
# the upstream-style test files it adds must pass on the tree with that patch alone and fail on the
# pristine tree (run by tests/upstream_compat, with the tree's deepspeed first on sys.path, so nothing
# is installed). A patch that needs another one says so with a line "Needs: NNNN" in its commit
# message; it is then applied on top of that one.
#
#   scripts/prove-independent.sh VERSION [--test] [--keep]
#
# Trees go to build/independent-VERSION/ (removed at the end unless --keep). Exit 0 when every patch
# passes, 1 when one does not (each failure is reported; all patches are tried), 2 on bad usage.
# Run by `tox -e pristine-v0198`; CI runs that environment.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
PROG=prove-independent.sh
PYTHON=${PYTHON:-python}

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
VERSION='' TEST=0 KEEP=0
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --test) TEST=1 ;;
        --keep) KEEP=1 ;;
        -*) echo "$PROG: unknown option $1" >&2; exit 2 ;;
        *) [[ -z $VERSION ]] || { echo "$PROG: one VERSION only" >&2; exit 2; }; VERSION=$1 ;;
    esac
    shift
done
[[ -n $VERSION ]] || { usage >&2; exit 2; }
SERIES_DIR=patches/$VERSION
[[ -f $SERIES_DIR/series ]] || { echo "$PROG: $SERIES_DIR/series does not exist" >&2; exit 2; }

WORK=build/independent-$VERSION
BASE=$WORK/pristine
# apply.sh is idempotent for the same request: a second run reuses the pristine tree.
bash scripts/apply.sh "$VERSION" --pristine --dest "$BASE" >/dev/null
base_commit=$(git -C "$BASE" rev-parse HEAD)
# the runner roots pytest in the tree's tests/ directory, which an sdist tree lacks (untracked, harmless)
mkdir -p "$BASE/tests"
echo "$PROG: base $VERSION at $base_commit ($BASE)"

cleanup() { ((KEEP)) || rm -rf -- "$WORK"/p-*; }
trap cleanup EXIT

mapfile -t patches < <(grep -v '^[[:space:]]*\(#\|$\)' "$SERIES_DIR/series")
status=0
for patch in "${patches[@]}"; do
    number=${patch%%-*}
    tree=$WORK/p-$number
    rm -rf -- "$tree"
    git clone --quiet --shared --no-checkout "$BASE" "$tree"
    git -C "$tree" checkout --quiet --detach "$base_commit"
    needs=$(sed -n 's/^Needs: \([0-9][0-9][0-9][0-9]\).*/\1/p' "$SERIES_DIR/$patch" | head -n 1)
    to_apply=()
    if [[ -n $needs ]]; then
        to_apply+=("$(ls "$SERIES_DIR/$needs"-*.patch)")
    fi
    to_apply+=("$SERIES_DIR/$patch")
    # the patches name no author: the proof's trees commit them as "prove" (scripts/patch-author.awk)
    if ! (for p in "${to_apply[@]}"; do
        awk -v from="From: prove <prove@localhost>" -f scripts/patch-author.awk "$p" |
            git -C "$tree" -c user.name=prove -c user.email=prove@localhost am --quiet || exit 1
    done) >"$tree.am.log" 2>&1; then
        echo "$PROG: $patch does NOT apply alone on $VERSION${needs:+ (with $needs)}:" >&2
        cat "$tree.am.log" >&2
        status=1
        continue
    fi
    echo "$PROG: $patch applies alone${needs:+ on top of $needs}"
    ((TEST)) || continue
    mapfile -t tests < <(git -C "$tree" diff --name-only --diff-filter=A "$base_commit" HEAD -- 'tests/unit/*.py')
    if ((${#tests[@]} == 0)); then
        echo "$PROG: $patch adds no test file under tests/unit/" >&2
        status=1
        continue
    fi
    for test in "${tests[@]}"; do
        if "$PYTHON" -m tests.upstream_compat.run "$tree" "$tree/$test" -q >"$tree.pass.log" 2>&1; then
            echo "$PROG:   $test passes with $number alone"
        else
            echo "$PROG:   $test FAILS with $number alone:" >&2
            tail -n 30 "$tree.pass.log" >&2
            status=1
        fi
        # the same file against the pristine tree's deepspeed: every test in it that is not a guard must fail
        "$PYTHON" -m tests.upstream_compat.run "$BASE" "$PWD/$tree/$test" -q -rfEs >"$tree.pristine.log" 2>&1 || true
        failed=$(grep -c '^FAILED' "$tree.pristine.log" || true)
        if ((failed == 0)); then
            echo "$PROG:   $test does not fail on pristine $VERSION: it proves nothing" >&2
            tail -n 30 "$tree.pristine.log" >&2
            status=1
        else
            echo "$PROG:   $test fails on pristine $VERSION: $(tail -n 1 "$tree.pristine.log")"
        fi
    done
done
exit $status
