#!/usr/bin/env bash
# Applies this directory's TRL patch to TRL 1.16.0 with git am, in a git checkout made from TRL's
# PyPI sdist, and runs the patch's own test there. See --help.
set -Eeuo pipefail

PROG=integrations/trl/check.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
TRL_VERSION=1.16.0
SDIST_NAME=trl-$TRL_VERSION.tar.gz
SDIST_SHA256=999bd4a85b08870b7bfa387e1efa5177d2a4b88fe82b2526a057ac5d3cc600cd
PATCH_TEST=tests/test_deepspeed_non_reentrant_gate.py

usage() {
    cat <<EOF
Usage: $PROG [--dest DIR] [--sdist PATH] [--python PYTHON]

Unpacks TRL $TRL_VERSION's sdist (sha256-checked) into DIR (default: a new temporary directory),
commits it as the base of a git repository, applies $(basename -- "$HERE")/0001-*.patch with
git am, and runs $PATCH_TEST with PYTHON (default: python3; it needs pytest and
packaging, nothing of TRL's other requirements). Prints the applied commit and pytest's result.

The sdist comes from --sdist (a file, or a directory that holds $SDIST_NAME), else from
\$TRL_SDIST, else from a directory in \$PIP_FIND_LINKS, else pip download (PyPI).

Exit codes: 0 applied and passed; 2 bad command line; 7 no sdist; 8 sdist sha256 mismatch;
9 the patch did not apply; 1 its test failed (or another command did).
EOF
}

die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}

DEST='' SDIST=${TRL_SDIST:-} PY=${PYTHON:-python3}
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --dest | --sdist | --python)
            if (($# < 2)) || [[ -z $2 ]]; then die 2 "option $1 needs a value"; fi
            case $1 in
                --dest) DEST=$2 ;;
                --sdist) SDIST=$2 ;;
                --python) PY=$2 ;;
            esac
            shift
            ;;
        *) die 2 "unexpected argument '$1' (see --help)" ;;
    esac
    shift
done

if [[ -n $DEST ]]; then
    [[ ! -e $DEST ]] || die 2 "--dest $DEST exists; give a new directory"
    mkdir -p -- "$DEST"
else
    DEST=$(mktemp -d "${TMPDIR:-/tmp}/trl-$TRL_VERSION.XXXXXX")
fi
# Without a checkout to look at (no sdist, a wrong one), nothing is left behind; after a failed
# git am or test, the checkout stays for inspection.
cleanup() {
    local code=$?
    rm -rf -- "$DEST.download"
    if ((code != 0 && code != 1 && code != 9)); then rm -rf -- "$DEST"; fi
}
trap cleanup EXIT

# Where the sdist comes from, in the order --help gives.
find_sdist() {
    local dir
    if [[ -n $SDIST ]]; then
        if [[ -d $SDIST ]]; then SDIST=$SDIST/$SDIST_NAME; fi
        [[ -f $SDIST ]] || die 7 "no sdist at $SDIST"
        return
    fi
    local IFS=' '
    for dir in ${PIP_FIND_LINKS:-}; do
        if [[ -f $dir/$SDIST_NAME ]]; then
            SDIST=$dir/$SDIST_NAME
            return
        fi
    done
    mkdir -p -- "$DEST.download"
    if ! "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        --dest "$DEST.download" "trl==$TRL_VERSION" >"$DEST.download/log" 2>&1; then
        die 7 "pip download trl==$TRL_VERSION failed: $(tail -n 1 -- "$DEST.download/log"); pass --sdist"
    fi
    SDIST=$DEST.download/$SDIST_NAME
    [[ -f $SDIST ]] || die 7 "pip download did not produce $SDIST_NAME; pass --sdist"
}
find_sdist
found=$(sha256sum -- "$SDIST" | cut -d' ' -f1)
[[ $found == "$SDIST_SHA256" ]] || die 8 "sha256 of $SDIST is $found, expected $SDIST_SHA256"
tar xzf "$SDIST" --no-same-owner --strip-components=1 -C "$DEST"
cd -- "$DEST"
# A fixed identity and date for the base: it stands for the sdist, not for anyone's commit.
base_env=(GIT_AUTHOR_NAME=sdist GIT_AUTHOR_EMAIL=sdist@localhost GIT_COMMITTER_NAME=sdist
    GIT_COMMITTER_EMAIL=sdist@localhost GIT_AUTHOR_DATE=2026-01-01T00:00:00Z
    GIT_COMMITTER_DATE=2026-01-01T00:00:00Z)
git init --quiet
git add --all
env "${base_env[@]}" git commit --quiet --no-gpg-sign -m "trl $TRL_VERSION (PyPI sdist, sha256 $SDIST_SHA256)"
patches=("$HERE"/0*.patch)
if ! env "${base_env[@]}" git -c user.name=check -c user.email=check@localhost am --quiet "${patches[@]}"; then
    git am --abort || true
    die 9 "$(basename -- "${patches[0]}") did not apply to TRL $TRL_VERSION in $DEST"
fi
echo "$PROG: TRL $TRL_VERSION in $DEST, with:"
git log --format='  %h %s' "HEAD~${#patches[@]}..HEAD"
PYTHONPATH=$DEST${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 \
    "$PY" -m pytest -q -p no:cacheprovider "$PATCH_TEST"
