#!/usr/bin/env bash
# Regenerate patches/VERSION/ (the series, its `series` file and a cover letter) from the commits of
# a checkout made by scripts/apply.sh. Run `scripts/export-patches.sh --help` for usage.
set -Eeuo pipefail

PROG=export-patches.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/export-patches.sh [--tree DIR] [--out DIR] [--branch NAME] [--base REV]
                                 [--upstream COMMIT] [--cover-letter FILE]

Write the commits base..branch of the patched checkout as a `git format-patch` series:
0000-cover-letter.patch, 0001-*.patch ..., and a `series` file listing the patches in order.
Stale NNNN-*.patch files and the old `series` in the output directory are removed; nothing
else there is touched.

The output is stable: unchanged commits give byte-identical files (zero commit ids in the
"From" lines, full blob ids, no signature, the cover letter dated like the last commit). It names
no person: the "From:" author header and Signed-off-by trailers are left out (apply.sh makes
whoever applies a patch its author; scripts/prepare-submission.sh adds the submitter's identity
and sign-off). The cover letter records "base-commit: <upstream commit>", the upstream id of the
pinned release, also when the checkout was built from the sdist (whose local base differs).

Options:
  --tree DIR          patched checkout (default: build/deepspeed-VERSION for the first version in
                      scripts/pinned-bases.tsv)
  --out DIR           output directory (default: patches/VERSION of this repository, VERSION being
                      the release apply.sh recorded for the branch)
  --branch NAME       branch to export (default: the branch checked out in the tree)
  --base REV          base of the series (default: recorded by apply.sh for the branch)
  --upstream COMMIT   commit id written as base-commit (default: recorded by apply.sh, or the
                      base itself)
  --cover-letter FILE subject (first line) and body (after the first blank line) of the cover
                      letter (default: cover-letter.txt in the output directory, else in
                      patches/VERSION)
  -h, --help          show this help

Exit codes: 0 done, 1 internal error, 2 malformed command line, 3 the tree, branch or base is
not usable (not a git checkout, no recorded base, merge commits, no commits to export).
EOF
}

die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}
info() { printf '%s: %s\n' "$PROG" "$*" >&2; }

TREE='' OUT='' BRANCH='' BASE='' UPSTREAM='' COVER=''
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --tree | --out | --branch | --base | --upstream | --cover-letter)
            if (($# < 2)) || [[ -z $2 ]]; then die 2 "option $1 needs a value"; fi
            case $1 in
                --tree) TREE=$2 ;;
                --out) OUT=$2 ;;
                --branch) BRANCH=$2 ;;
                --base) BASE=$2 ;;
                --upstream) UPSTREAM=$2 ;;
                --cover-letter) COVER=$2 ;;
            esac
            shift
            ;;
        *) die 2 "unexpected argument '$1' (see --help)" ;;
    esac
    shift
done

if [[ -z $TREE ]]; then
    first=$(awk -F'\t' '$1 !~ /^#/ && NF >= 4 {print $1; exit}' "$SCRIPT_DIR/pinned-bases.tsv")
    TREE=$REPO_ROOT/build/deepspeed-$first
fi
TREE=$(git -C "$TREE" rev-parse --show-toplevel 2>/dev/null) || die 3 "--tree $TREE is not a git checkout"

if [[ -z $BRANCH ]]; then
    BRANCH=$(git -C "$TREE" symbolic-ref -q --short HEAD) ||
        die 3 "$TREE has a detached HEAD; name the branch with --branch"
fi
git -C "$TREE" show-ref --verify --quiet "refs/heads/$BRANCH" || die 3 "no branch $BRANCH in $TREE"
# Each pinned release has its own series directory: patches/v0.19.2, patches/v0.19.8, ...
version=$(git -C "$TREE" config --get "branch.$BRANCH.zero3version" || true)
if [[ -z $OUT ]]; then
    [[ -n $version ]] || die 3 "branch $BRANCH in $TREE has no release recorded by apply.sh; pass --out DIR"
    OUT=$REPO_ROOT/patches/$version
fi
if [[ -z $COVER ]]; then
    COVER=$OUT/cover-letter.txt
    [[ -f $COVER || -z $version ]] || COVER=$REPO_ROOT/patches/$version/cover-letter.txt
fi
[[ -f $COVER ]] || die 2 "cover letter text not found: $COVER"
if [[ -z $BASE ]]; then
    BASE=$(git -C "$TREE" config --get "branch.$BRANCH.zero3base") ||
        die 3 "branch $BRANCH in $TREE has no base recorded by apply.sh; pass --base REV"
fi
BASE=$(git -C "$TREE" rev-parse -q --verify "$BASE^{commit}") || die 3 "base $BASE is not a commit in $TREE"
if [[ -z $UPSTREAM ]]; then
    UPSTREAM=$(git -C "$TREE" config --get "branch.$BRANCH.zero3upstream" || echo "$BASE")
    # '-': a release pinned by its sdist alone; the reproducible sdist import commit is the base.
    [[ $UPSTREAM != - ]] || UPSTREAM=$BASE
fi
[[ $UPSTREAM =~ ^[0-9a-f]{40}$ ]] || die 2 "--upstream must be a full 40-hex commit id, got '$UPSTREAM'"
git -C "$TREE" merge-base --is-ancestor "$BASE" "refs/heads/$BRANCH" || die 3 "base $BASE is not an ancestor of $BRANCH"
[[ -z $(git -C "$TREE" rev-list --merges "$BASE..refs/heads/$BRANCH") ]] ||
    die 3 "$BASE..$BRANCH contains merge commits; a patch series must be linear"
count=$(git -C "$TREE" rev-list --count "$BASE..refs/heads/$BRANCH")
((count > 0)) || die 3 "no commits on $BRANCH since the base $BASE: nothing to export"
git -C "$TREE" diff --quiet HEAD -- 2>/dev/null ||
    info "note: $TREE has uncommitted changes; only commits are exported"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/zero3-export.XXXXXX")
trap 'rm -rf -- "$TMP"' EXIT

# The cover letter's Date comes from the committer date git sees (its From is dropped below);
# taking it from the last commit's author makes the cover letter a function of the commits alone.
last=$(git -C "$TREE" rev-parse "refs/heads/$BRANCH")
IFS=$'\n' read -r -d '' an ae ad < <(git -C "$TREE" log -1 --format='%an%n%ae%n%ad%x00' --date=raw "$last") || true

# Global and system config (format.*, diff.*, core.abbrev) must not change the bytes; the
# options below also override what a checkout's own config could set.
GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 \
    GIT_COMMITTER_NAME=$an GIT_COMMITTER_EMAIL=$ae GIT_COMMITTER_DATE=$ad \
    git -C "$TREE" \
    -c diff.renames=true -c diff.algorithm=myers -c diff.context=3 -c diff.interHunkContext=0 \
    -c diff.noprefix=false -c diff.mnemonicPrefix=false -c diff.suppressBlankEmpty=false \
    -c core.quotePath=true -c format.encodeEmailHeaders=true -c i18n.logOutputEncoding=UTF-8 \
    format-patch --quiet --output-directory "$TMP/out" --cover-letter --numbered \
    --zero-commit --full-index --no-signature --no-thread --no-attach --no-to --no-cc \
    --no-add-header --no-notes --suffix=.patch --base="$BASE" \
    "$BASE..refs/heads/$BRANCH"

# The committed patches name no person: the author header and every Signed-off-by trailer are
# dropped here. Whoever applies a patch becomes its author (apply.sh), and the submitter's own
# identity and DCO sign-off are added when a batch is prepared (prepare-submission.sh). Only
# header lines (before the first blank line) and message lines (before the "---" that opens
# the diffstat) are looked at, so no line of a diff is ever dropped.
for f in "$TMP"/out/*.patch; do
    # Blank message lines are held back until a line that stays follows, so the blank line
    # that separated the dropped trailers from the body goes with them.
    awk '
        part == 0 && /^$/ { part = 1; print; next }
        part == 1 && /^---$/ { part = 2; blanks = 0 }
        part == 0 && /^From: / { skipping = 1; next }
        part == 0 && skipping && /^[ \t]/ { next }
        { skipping = 0 }
        part == 1 && /^Signed-off-by: / { next }
        part == 1 && /^$/ { blanks++; next }
        { for (; blanks > 0; blanks--) print ""; print }
    ' "$f" >"$f.anon"
    mv -- "$f.anon" "$f"
done

cover=$TMP/out/0000-cover-letter.patch
[[ -f $cover ]] || die 1 "git format-patch wrote no cover letter"
# Subject: the first line of the text file; body: everything after the first blank line.
awk 'NR == 1 {print; exit}' "$COVER" >"$TMP/subject"
awk 'body {print} !body && /^[[:space:]]*$/ {body = 1}' "$COVER" >"$TMP/blurb"
[[ -s $TMP/subject ]] || die 2 "$COVER: the first line (the cover letter subject) is empty"
awk -v subj="$TMP/subject" -v blurb="$TMP/blurb" -v local_base="$BASE" -v upstream="$UPSTREAM" '
    BEGIN { getline s < subj }
    /^Subject: .*\*\*\* SUBJECT HERE \*\*\*$/ { sub(/\*\*\* SUBJECT HERE \*\*\*$/, ""); print $0 s; next }
    $0 == "*** BLURB HERE ***" { while ((getline l < blurb) > 0) print l; next }
    $0 == "base-commit: " local_base { print "base-commit: " upstream; next }
    # the shortlog is headed by the author of the commits; it names the patches instead
    !shortlog && /^[^ ].* \([0-9]+\):$/ { sub(/^.* \(/, "Patches ("); shortlog = 1 }
    { print }
' "$cover" >"$TMP/cover.new"
mv -- "$TMP/cover.new" "$cover"
# git writes the base in the cover letter only; make sure the local (sdist) id is gone everywhere.
grep -q "^base-commit: $UPSTREAM\$" "$cover" || die 1 "could not record base-commit $UPSTREAM in the cover letter"
if [[ $UPSTREAM != "$BASE" ]] && grep -l -- "$BASE" "$TMP"/out/*.patch >/dev/null; then
    die 1 "the local base id $BASE is still present in the output"
fi

for f in "$TMP"/out/[0-9][0-9][0-9][0-9]-*.patch; do
    f=${f##*/}
    [[ $f == 0000-* ]] || printf '%s\n' "$f"
done >"$TMP/out/series"

mkdir -p -- "$OUT"
for f in "$OUT"/[0-9][0-9][0-9][0-9]-*.patch "$OUT/series"; do
    if [[ -e $f ]]; then rm -f -- "$f"; fi
done
cp -- "$TMP"/out/* "$OUT"/
info "exported $count patch(es) of $BRANCH ($TREE) to $OUT, base-commit $UPSTREAM:"
sed 's/^/  /' "$OUT/series" >&2
