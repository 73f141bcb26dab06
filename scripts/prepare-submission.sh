#!/usr/bin/env bash
# Write one batch of a series as `git format-patch` files authored and signed off by you, ready to
# send or to push as a pull request. Run `scripts/prepare-submission.sh --help` for usage.
set -Eeuo pipefail

PROG=prepare-submission.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/prepare-submission.sh VERSION BATCH [--out DIR]

The committed patches name no person. This writes the patches of BATCH (a name from
patches/VERSION/batches, or "all" for the whole series) as `git format-patch` files whose author
is you and whose messages end with your DCO sign-off ("Signed-off-by: NAME <EMAIL>"), taken from
`git config user.name` and `git config user.email`. Only sign off if you can certify the DCO
(https://developercertificate.org/) for these patches: nobody can sign off for someone else.

It builds the pristine release with only the batch applied (scripts/apply.sh, which verifies the
base), so a batch that does not apply alone fails here, and exports it to DIR (default
build/submission/VERSION-BATCH; files of an earlier run there are replaced). When
patches/VERSION/batch-BATCH.txt exists it becomes the cover letter (first line: subject).

Exit codes: 0 written, 2 malformed command line, 3 no git identity configured, 4 unknown VERSION
or BATCH, 9 the batch does not apply alone (apply.sh's message says where); others: apply.sh's.
EOF
}

die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}

VERSION='' BATCH='' OUT=''
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --out)
            (($# >= 2)) && [[ -n $2 ]] || die 2 "--out needs a directory"
            OUT=$2
            shift
            ;;
        -*) die 2 "unknown option $1 (see --help)" ;;
        *)
            if [[ -z $VERSION ]]; then VERSION=$1
            elif [[ -z $BATCH ]]; then BATCH=$1
            else die 2 "unexpected argument '$1' (see --help)"
            fi
            ;;
    esac
    shift
done
[[ -n $VERSION && -n $BATCH ]] || die 2 "VERSION and BATCH are required (see --help)"

# The submitter's identity, as git resolves it in this repository (its own, global or system
# config). The environment's GIT_AUTHOR_*/GIT_COMMITTER_* are not consulted: the sign-off is a
# statement of whoever configured git here.
name=$(git -C "$REPO_ROOT" config --get user.name || true)
email=$(git -C "$REPO_ROOT" config --get user.email || true)
if [[ -z $name || -z $email ]]; then
    die 3 "no git identity: the patches are authored and signed off (DCO) by the submitter, which is you. Set it first:
  git config --global user.name \"Your Name\"
  git config --global user.email you@example.com"
fi

PATCH_DIR=$REPO_ROOT/patches/$VERSION
[[ -f $PATCH_DIR/series ]] || die 4 "no series for $VERSION (patches/$VERSION/series does not exist)"
mapfile -t all < <(grep -v '^[[:space:]]*\(#\|$\)' "$PATCH_DIR/series")
if [[ $BATCH == all ]]; then
    chosen=("${all[@]}")
else
    [[ -f $PATCH_DIR/batches ]] || die 4 "patches/$VERSION has no batches file; use BATCH 'all'"
    line=$(awk -v b="$BATCH" '$1 !~ /^#/ && $1 == b' "$PATCH_DIR/batches")
    if [[ -z $line ]]; then
        known=$(awk '$1 !~ /^#/ && NF {printf "%s ", $1}' "$PATCH_DIR/batches")
        die 4 "no batch '$BATCH' in patches/$VERSION/batches (batches: ${known}all)"
    fi
    chosen=()
    for number in $(cut -d' ' -f2- <<<"$(tr -s ' \t' '  ' <<<"$line")"); do
        match=$(printf '%s\n' "${all[@]}" | grep "^$number-" || true)
        [[ -n $match ]] || die 4 "batch $BATCH names patch $number, which is not in patches/$VERSION/series"
        chosen+=("$match")
    done
fi

OUT=${OUT:-$REPO_ROOT/build/submission/$VERSION-$BATCH}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zero3-submit.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT
mkdir -- "$WORK/patches"
for p in "${chosen[@]}"; do ln -s -- "$PATCH_DIR/$p" "$WORK/patches/$p"; done
printf '%s\n' "${chosen[@]}" >"$WORK/patches/series"

# apply.sh commits each patch as the identity in the environment: author and committer are you.
export GIT_AUTHOR_NAME=$name GIT_AUTHOR_EMAIL=$email GIT_COMMITTER_NAME=$name GIT_COMMITTER_EMAIL=$email
rc=0
bash "$SCRIPT_DIR/apply.sh" "$VERSION" --patch-dir "$WORK/patches" --dest "$WORK/tree" \
    --branch "submit/$BATCH" >"$WORK/apply.log" 2>&1 || rc=$?
if ((rc)); then
    sed 's/^/  /' "$WORK/apply.log" >&2
    die "$rc" "could not build $VERSION with batch $BATCH alone (scripts/apply.sh, exit $rc; its output is above)"
fi
base=$(git -C "$WORK/tree" config --get "branch.submit/$BATCH.zero3base")

cover=()
letter=$PATCH_DIR/batch-$BATCH.txt
[[ -f $letter ]] && cover=(--cover-letter)
mkdir -p -- "$OUT"
rm -f -- "$OUT"/[0-9][0-9][0-9][0-9]-*.patch
GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 git -C "$WORK/tree" format-patch --quiet --signoff \
    --numbered --no-signature --output-directory "$OUT" "${cover[@]}" "$base..HEAD"
if ((${#cover[@]})); then
    # subject: the letter's first line; body: the rest after the first blank line
    awk -v letter="$letter" '
        BEGIN { getline subject < letter; while ((getline l < letter) > 0) { if (started) body = body l "\n"; else if (l ~ /^[[:space:]]*$/) started = 1 } }
        /\*\*\* SUBJECT HERE \*\*\*/ { sub(/\*\*\* SUBJECT HERE \*\*\*/, subject) }
        $0 == "*** BLURB HERE ***" { printf "%s", body; next }
        { print }
    ' "$OUT/0000-cover-letter.patch" >"$WORK/cover" && mv -- "$WORK/cover" "$OUT/0000-cover-letter.patch"
fi
count=$(git -C "$WORK/tree" rev-list --count "$base..HEAD")
printf '%s: wrote %d patch(es) of %s batch %s to %s, authored and signed off by %s <%s>:\n' \
    "$PROG" "$count" "$VERSION" "$BATCH" "$OUT" "$name" "$email"
(cd -- "$OUT" && ls -1 -- *.patch | sed 's/^/  /')
