#!/usr/bin/env bash
# Build a DeepSpeed git checkout at a pinned release with this repository's patch series applied.
# Run `scripts/apply.sh --help` for usage; the exit codes are listed there and in README.md.
set -Eeuo pipefail

PROG=apply.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

# Exit codes. They are part of the interface (README.md lists them): scripts and the tests tell
# failures apart by them, so never renumber one.
readonly E_INTERNAL=1 E_USAGE=2 E_VERSION=3 E_FOREIGN=4 E_DIFFERENT=5 E_CHECKOUT=6 E_NOBASE=7 \
    E_VERIFY=8 E_PATCH=9 E_SERIES=10 E_CONFLICT=11

readonly DEFAULT_GIT_URL=https://github.com/deepspeedai/DeepSpeed.git
# The sdist import commit gets this fixed identity and date so that its id depends only on the
# sdist's content: every machine then builds the same base and the same patched commit ids.
readonly IMPORT_NAME='DeepSpeed sdist import' IMPORT_EMAIL='sdist-import@zero3-patches.invalid'
readonly IMPORT_DATE='2000-01-01T00:00:00+0000'
# Used only when the destination repository has no committer identity at all (fresh CI machines).
readonly FALLBACK_NAME='zero3 apply.sh' FALLBACK_EMAIL='apply.sh@zero3-patches.invalid'
readonly MARKER_NAME=zero3-apply

usage() {
    cat <<'EOF'
Usage: scripts/apply.sh VERSION [options]
       scripts/apply.sh VERSION --onto BRANCH [--checkout FORK] [options]

Create a DeepSpeed git checkout at the pinned release VERSION (e.g. v0.19.2) with the patch
series applied by `git am`, then print its path and the applied commits.

With --onto, bring the series onto BRANCH of your own DeepSpeed clone or fork (the current
directory's repository, or --checkout FORK), which must be based on VERSION: the patched tree is
built from the verified base in a scratch directory, its commits are fetched into the fork (ref
refs/zero3/VERSION) and cherry-picked onto BRANCH with real 3-way merges, after the fork's own
commits. Where the fork changed the same lines, git stops at the conflict as any cherry-pick does,
and apply.sh prints the files and the exact commands to resume (git cherry-pick --continue) or to
return BRANCH to where it was (git cherry-pick --abort). Patches whose subject is already on
BRANCH (a run resumed by hand, or run again) are skipped.

Options:
  --onto BRANCH       your fork's branch to bring the series onto (see above); with --checkout
                      FORK naming the clone when it is not the current directory's. --force
                      then means: apply the series although BRANCH's version.txt names another
                      release.
  --dest DIR          where to create the checkout (default: build/deepspeed-VERSION in this
                      repository). It must not exist, or must have been created by apply.sh.
  --checkout PATH     use your own DeepSpeed clone or fork instead: a new branch is created at the
                      pinned commit; your other branches are never touched. Refused if the
                      working tree has uncommitted changes.
  --branch NAME       branch to create (default: zero3/VERSION)
  --source SRC        auto (default), checkout, git or sdist. auto tries, in order: --checkout if
                      given, a git clone of upstream, then the PyPI sdist (--sdist FILE implies sdist).
  --sdist PATH        an already downloaded sdist file, or a directory that holds it
                      (env DEEPSPEED_SDIST does the same without changing the auto order)
  --patches N         apply only the first N patches of the series (for bisecting)
  --pristine          apply no patches (same as --patches 0)
  --patch-dir DIR     patch directory with a `series` file (default: patches/VERSION in this
                      repository, the series made for that release; for v0.19.3 to v0.19.7, the
                      v0.19.8 follow-up's units, each as it is or by its port in
                      patches/v0.19.8/ports/VERSION/, put together under build/followup-series/)
  --force             re-create a destination (or branch) that apply.sh created earlier
  -h, --help          show this help

Environment:
  DEEPSPEED_GIT_URL       upstream git URL (default https://github.com/deepspeedai/DeepSpeed.git)
  DEEPSPEED_GIT_PROBE_TIMEOUT  seconds to wait for the remote to answer (default 20)
  DEEPSPEED_GIT_TIMEOUT   seconds allowed for the whole clone (default 900)
  DEEPSPEED_SDIST         sdist file, or directory holding it (also searched: PIP_FIND_LINKS dirs)
  ZERO3_PINNED_BASES      pinned-bases file to use instead of scripts/pinned-bases.tsv
  PYTHON                  interpreter whose pip downloads the sdist, and that runs
                          scripts/followup_releases.py for v0.19.3 to v0.19.7 (default python3)

Exit codes:
  0   patched checkout created, or already present with the same version and patches
  1   internal error (a command failed unexpectedly)
  2   malformed command line
  3   unknown VERSION (not in the pinned-bases file) or unreadable pinned-bases file
  4   destination exists and was not created by apply.sh
  5   destination (or branch) was created by apply.sh for another version or patch set: use --force
  6   --checkout problem: not a git checkout, uncommitted changes, an operation in progress,
      or the branch exists and is not apply.sh's
  7   no source could provide the base (clone failed, sdist not found or not downloadable,
      pinned commit missing from the checkout)
  8   base verification failed (tag at another commit, sdist sha256 mismatch, odd sdist layout)
  9   a patch did not apply (nothing is left behind; with --onto, the message says where BRANCH is)
  10  patch directory or series file problem (missing file, --patches larger than the series)
  11  --onto: a patch conflicts with the fork's branch; the fork is left in git's ordinary
      cherry-pick state at that patch, and the message says how to resume or abort
  130 interrupted (Ctrl-C); 143: terminated. What the run had created is removed, as on any error
EOF
}

die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}

info() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# Command line

VERSION='' N_PATCHES='' DEST='' FORCE=0 SOURCE=auto PATCH_DIR='' CHECKOUT='' BRANCH='' SDIST_ARG=''
PRISTINE=0 ONTO=''

set_opt() {
    local opt=$1 val=$2
    [[ -n $val ]] || die "$E_USAGE" "option $opt needs a non-empty value"
    # Paths and names end up in git config, in messages and in line-based output: a control
    # character (newline, escape) there is never meant and would corrupt all of those.
    [[ $val != *[[:cntrl:]]* ]] || die "$E_USAGE" "option $opt: value contains a control character"
    case $opt in
        --patches)
            [[ $val =~ ^[0-9]+$ ]] || die "$E_USAGE" "--patches takes a non-negative integer, got '$val'"
            N_PATCHES=$((10#$val))
            ;;
        --dest) DEST=$val ;;
        --source)
            case $val in
                auto | checkout | git | sdist) SOURCE=$val ;;
                *) die "$E_USAGE" "--source must be one of auto, checkout, git, sdist; got '$val'" ;;
            esac
            ;;
        --patch-dir) PATCH_DIR=$val ;;
        --checkout) CHECKOUT=$val ;;
        --branch) BRANCH=$val ;;
        --sdist) SDIST_ARG=$val ;;
        --onto) ONTO=$val ;;
    esac
}

while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --pristine) PRISTINE=1 ;;
        --force) FORCE=1 ;;
        --patches | --dest | --source | --patch-dir | --checkout | --branch | --sdist | --onto)
            (($# >= 2)) || die "$E_USAGE" "option $1 needs a value"
            set_opt "$1" "$2"
            shift
            ;;
        --patches=* | --dest=* | --source=* | --patch-dir=* | --checkout=* | --branch=* | --sdist=* | --onto=*)
            set_opt "${1%%=*}" "${1#*=}"
            ;;
        --)
            shift
            break
            ;;
        -?*) die "$E_USAGE" "unknown option '$1' (see --help)" ;;
        *)
            [[ -z $VERSION ]] || die "$E_USAGE" "more than one VERSION given ('$VERSION' and '$1')"
            VERSION=$1
            ;;
    esac
    shift
done
while (($#)); do
    [[ -z $VERSION ]] || die "$E_USAGE" "more than one VERSION given ('$VERSION' and '$1')"
    VERSION=$1
    shift
done

[[ -n $VERSION ]] || die "$E_USAGE" "missing VERSION argument, e.g. v0.19.2 (see --help)"
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "$E_USAGE" "malformed VERSION '$VERSION' (expected a release tag like v0.19.2)"
if ((PRISTINE)); then
    [[ -z $N_PATCHES || $N_PATCHES == 0 ]] || die "$E_USAGE" "--pristine conflicts with --patches $N_PATCHES"
    N_PATCHES=0
fi
if [[ -n $ONTO ]]; then
    # The fork is where the series goes; the base for the series' commits is built as without
    # --checkout (SOURCE picks how), in a scratch directory.
    ((PRISTINE)) && die "$E_USAGE" "--onto brings patches onto a branch: it cannot be combined with --pristine"
    for opt in DEST BRANCH; do
        [[ -z ${!opt} ]] || die "$E_USAGE" "--onto cannot be combined with --${opt,,} (the fork's branch is BRANCH itself)"
    done
    [[ $SOURCE != checkout ]] || die "$E_USAGE" "--onto cannot be combined with --source checkout"
    git check-ref-format --branch "$ONTO" >/dev/null 2>&1 || die "$E_USAGE" "invalid branch name '$ONTO' for --onto"
    CHECKOUT=${CHECKOUT:-$PWD}
elif [[ -n $CHECKOUT ]]; then
    [[ -z $DEST ]] || die "$E_USAGE" "--dest cannot be combined with --checkout (the checkout is the destination)"
    [[ $SOURCE == auto || $SOURCE == checkout ]] ||
        die "$E_USAGE" "--checkout cannot be combined with --source $SOURCE"
    SOURCE=checkout
elif [[ $SOURCE == checkout ]]; then
    die "$E_USAGE" "--source checkout needs --checkout PATH"
fi
if [[ -n $SDIST_ARG && $SOURCE == auto ]]; then
    # Naming a local sdist means "use this file": trying the network first would only add delay.
    SOURCE=sdist
fi
[[ -n $SDIST_ARG && $SOURCE != sdist ]] && die "$E_USAGE" "--sdist cannot be combined with --source $SOURCE"
BRANCH=${BRANCH:-zero3/$VERSION}
git check-ref-format --branch "$BRANCH" >/dev/null 2>&1 || die "$E_USAGE" "invalid branch name '$BRANCH'"

# ---------------------------------------------------------------------------------------------
# Pinned base

PINNED_FILE=${ZERO3_PINNED_BASES:-$SCRIPT_DIR/pinned-bases.tsv}
[[ -f $PINNED_FILE && -r $PINNED_FILE ]] || die "$E_VERSION" "pinned-bases file not found: $PINNED_FILE"
PIN_COMMIT='' PIN_SDIST='' PIN_SHA='' PIN_TESTS='' PIN_TESTS_SHA='' KNOWN='' FOUND=0
while IFS=$'\t' read -r v c s h t th _ || [[ -n ${v:-} ]]; do
    [[ -z $v || $v == \#* ]] && continue
    KNOWN+=" ${v%%[[:space:]]*}"
    [[ ${v%%[[:space:]]*} == "$VERSION" ]] || continue
    [[ $v == "$VERSION" && ($c =~ ^[0-9a-f]{40}$ || $c == -) && $h =~ ^[0-9a-f]{64}$ &&
        $s =~ ^[A-Za-z0-9._+-]+\.tar\.gz$ ]] ||
        die "$E_VERSION" "malformed line for $VERSION in $PINNED_FILE (want: tag, 40-hex commit or -, sdist name, 64-hex sha256, separated by one TAB each)"
    [[ -z ${t:-} || ($t =~ ^[A-Za-z0-9._+-]+\.tgz$ && ${th:-} =~ ^[0-9a-f]{64}$) ]] ||
        die "$E_VERSION" "malformed upstream-tests fields for $VERSION in $PINNED_FILE (want: snapshot .tgz name, 64-hex sha256)"
    PIN_COMMIT=$c PIN_SDIST=$s PIN_SHA=$h PIN_TESTS=${t:-} PIN_TESTS_SHA=${th:-} FOUND=1
done <"$PINNED_FILE"
((FOUND)) || die "$E_VERSION" "unknown version '$VERSION': not in $PINNED_FILE (known:${KNOWN:- none})"
# '-': the release is pinned by its sdist alone (no upstream commit could be verified when it was
# pinned), so only the sdist source can prove that the base is that release.
PIN_BY_SDIST_ONLY=0
[[ $PIN_COMMIT != - ]] || PIN_BY_SDIST_ONLY=1

# ---------------------------------------------------------------------------------------------
# Patch series

SERIES=()
if [[ -z $PATCH_DIR && ! -d $REPO_ROOT/patches/$VERSION && -d $REPO_ROOT/patches/v0.19.8/ports/$VERSION &&
    ${N_PATCHES:-x} != 0 ]]; then
    # A release between upstream's fix and v0.19.8 (v0.19.3 to v0.19.7) has no series of its own: it takes
    # the v0.19.8 follow-up's units in merge order, each as it is or by its port in
    # patches/v0.19.8/ports/VERSION/, as docs/_generated/followup-releases.json records them.
    PATCH_DIR=$REPO_ROOT/build/followup-series/$VERSION
    # its one line of what it put together goes to stderr with apply.sh's other messages: stdout is the
    # checkout's path and commits
    "${PYTHON:-python3}" "$SCRIPT_DIR/followup_releases.py" --series-for "$VERSION" "$PATCH_DIR" >&2 ||
        die "$E_SERIES" "could not put the v0.19.8 follow-up's series for $VERSION together (see above)"
fi
PATCH_DIR=${PATCH_DIR:-$REPO_ROOT/patches/$VERSION}
[[ $PATCH_DIR == /* ]] || PATCH_DIR=$PWD/$PATCH_DIR
if [[ ${N_PATCHES:-x} != 0 ]]; then
    [[ -d $PATCH_DIR ]] || die "$E_SERIES" "patch directory not found: $PATCH_DIR"
    [[ -f $PATCH_DIR/series ]] ||
        die "$E_SERIES" "no series file in $PATCH_DIR (it lists the patch files to apply, in order)"
    while IFS= read -r line || [[ -n $line ]]; do
        line=${line%$'\r'}
        line=${line%%#*}
        line=${line#"${line%%[![:space:]]*}"}
        line=${line%"${line##*[![:space:]]}"}
        [[ -n $line ]] || continue
        [[ $line != */* && $line != .* ]] ||
            die "$E_SERIES" "series entry '$line' must be a plain file name inside $PATCH_DIR"
        [[ -f $PATCH_DIR/$line ]] || die "$E_SERIES" "series lists $line, which does not exist in $PATCH_DIR"
        SERIES+=("$line")
    done <"$PATCH_DIR/series"
    if [[ -z $N_PATCHES ]]; then
        N_PATCHES=${#SERIES[@]}
    elif ((N_PATCHES > ${#SERIES[@]})); then
        die "$E_SERIES" "--patches $N_PATCHES but the series in $PATCH_DIR has only ${#SERIES[@]} patches"
    fi
fi
N_PATCHES=${N_PATCHES:-0}
# Patch ids of every patch the series lists (also beyond --patches N, and read for --pristine too):
# a commit of an existing tree whose id is not among them is the user's own work, which --force
# would delete, so the refusal and --force name such commits.
SERIES_IDS=()
if [[ -f $PATCH_DIR/series ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
        line=${line%$'\r'}
        line=${line%%#*}
        line=${line//[[:space:]]/}
        [[ -n $line && $line != */* && -f $PATCH_DIR/$line ]] || continue
        id=$(git patch-id --stable <"$PATCH_DIR/$line" | cut -d' ' -f1)
        SERIES_IDS+=("${id:-empty}")
    done <"$PATCH_DIR/series"
fi
SERIES=("${SERIES[@]:0:N_PATCHES}")

# What "the same patch set" means when a destination already exists: the same diffs, in order.
# Patch ids ignore commit ids and dates, so a tree rebuilt elsewhere, or one whose commits were
# exported back to patches/, is recognised.
WANT_IDS=()
for p in "${SERIES[@]}"; do
    id=$(git patch-id --stable <"$PATCH_DIR/$p" | cut -d' ' -f1)
    WANT_IDS+=("${id:-empty}")
done

# ---------------------------------------------------------------------------------------------
# Cleanup: whatever this run created is removed again if it fails.

TMP=
WORK=            # fresh build directory created by this run (renamed to DEST on success)
CREATED_DIRS=()  # parent directories this run created, innermost last
CO=              # user checkout (top level) when --checkout is used
CO_ORIG=         # the branch (or commit, when detached) the user had checked out
CO_TMP_BRANCH=   # branch this run created in the user checkout

# What is said about the user's checkout is what git shows after the clean-up, never what it was
# meant to do: an am that cannot be aborted (a locked index) leaves the checkout mid-operation.
rollback() {
    local left
    if [[ -n $CO && -n $CO_TMP_BRANCH ]]; then
        git -C "$CO" am --abort >/dev/null 2>&1 || true
        left=$(in_progress "$CO")
        if [[ -z $left ]] && git -C "$CO" checkout -q "$CO_ORIG" -- 2>/dev/null; then
            git -C "$CO" branch -q -D "$CO_TMP_BRANCH" >/dev/null 2>&1 || true
            info "returned $CO to $CO_ORIG and deleted branch $CO_TMP_BRANCH: nothing of this run is left"
        else
            info "could not return $CO to $CO_ORIG${left:+: it is in the middle of a git operation ($left)}; branch $CO_TMP_BRANCH is left. To clean up: ${left:+git -C $CO am --abort; }git -C $CO checkout -q $CO_ORIG; git -C $CO branch -D $CO_TMP_BRANCH"
        fi
    fi
    if [[ -n $WORK && -e $WORK ]]; then
        rm -rf -- "$WORK"
        info "removed the unfinished tree: nothing of this run is left"
    fi
    local i
    for ((i = ${#CREATED_DIRS[@]} - 1; i >= 0; i--)); do
        rmdir -- "${CREATED_DIRS[i]}" 2>/dev/null || break
    done
}

on_exit() {
    local rc=$?
    trap - EXIT
    ((rc == 0)) || rollback
    [[ -z $TMP ]] || rm -rf -- "$TMP"
    exit "$rc"
}
trap on_exit EXIT
# Any command failing where the script did not expect it: report where, exit with E_INTERNAL.
trap 'printf "%s: internal error: command failed (status %s) at line %s: %s\n" "$PROG" "$?" "$LINENO" "$BASH_COMMAND" >&2; exit "$E_INTERNAL"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

TMP=$(mktemp -d "${TMPDIR:-/tmp}/zero3-apply.XXXXXX")

# ---------------------------------------------------------------------------------------------
# Helpers

# in_progress REPO: the git operation REPO is in the middle of, or nothing.
in_progress() {
    local repo=$1 f
    for f in rebase-apply rebase-merge MERGE_HEAD CHERRY_PICK_HEAD REVERT_HEAD sequencer BISECT_LOG; do
        if [[ -e $(git -C "$repo" rev-parse --path-format=absolute --git-path "$f") ]]; then
            printf '%s\n' "$f"
            return 0 # a bare return would give, in the EXIT trap, the status that the script exits with
        fi
    done
}

# Patch ids of the commits base..branch, oldest first.
have_ids() {
    local repo=$1 base=$2 branch=$3 c
    for c in $(git -C "$repo" rev-list --reverse "$base..refs/heads/$branch"); do
        c=$(git -C "$repo" show --format='commit %H' --patch "$c" | git patch-id --stable | cut -d' ' -f1)
        printf '%s\n' "${c:-empty}"
    done
}

# 0 when BRANCH in REPO holds VERSION's base plus exactly the requested patches.
same_request() {
    local repo=$1 have want
    [[ $(git -C "$repo" config --get "branch.$BRANCH.zero3version" || true) == "$VERSION" ]] || return 1
    [[ $(git -C "$repo" config --get "branch.$BRANCH.zero3upstream" || true) == "$PIN_COMMIT" ]] || return 1
    local base
    base=$(git -C "$repo" config --get "branch.$BRANCH.zero3base") || return 1
    have=$(have_ids "$repo" "$base" "$BRANCH") || return 1
    want=''
    if ((${#WANT_IDS[@]})); then want=$(printf '%s\n' "${WANT_IDS[@]}"); fi
    [[ $have == "$want" ]]
}

describe_state() {
    local repo=$1 base n v
    v=$(git -C "$repo" config --get "branch.$BRANCH.zero3version" || echo '?')
    base=$(git -C "$repo" config --get "branch.$BRANCH.zero3base" || true)
    n='?'
    [[ -n $base ]] && n=$(git -C "$repo" rev-list --count "$base..refs/heads/$BRANCH" 2>/dev/null || echo '?')
    printf 'version %s with %s patch(es)' "$v" "$n"
}

# The commits on BRANCH of REPO (since its recorded base) that are not patches of the series, one
# "<short id> <subject>" line each, oldest first.
foreign_commits() {
    local repo=$1 branch=$2 base c id
    base=$(git -C "$repo" config --get "branch.$branch.zero3base") || return 0
    for c in $(git -C "$repo" rev-list --reverse "$base..refs/heads/$branch"); do
        id=$(git -C "$repo" show --format='commit %H' --patch "$c" | git patch-id --stable | cut -d' ' -f1)
        [[ " ${SERIES_IDS[*]} " == *" ${id:-empty} "* ]] || git -C "$repo" log -1 --format='%h %s' "$c"
    done
}

# What --force would lose on BRANCH of REPO (and, with a third argument, in that tree's working
# directory), as one sentence.
force_loss() {
    local repo=$1 branch=$2 tree=${3:-} list n dirty=''
    list=$(foreign_commits "$repo" "$branch")
    if [[ -n $tree ]]; then
        dirty=$(git -C "$tree" status --porcelain -- . ':(exclude)deepspeed/git_version_info_installed.py' 2>/dev/null |
            cut -c4- | paste -sd, - | sed 's/,/, /g')
    fi
    if [[ -z $list ]]; then
        printf 'every commit on %s is a patch of the series' "$branch"
    else
        n=$(printf '%s\n' "$list" | wc -l)
        printf '%s commit(s) on %s are not in the series and --force deletes them (save them first, e.g. with git format-patch): %s' \
            "$n" "$branch" "$(printf '%s\n' "$list" | paste -sd';' - | sed 's/;/; /g')"
    fi
    [[ -z $dirty ]] || printf '; uncommitted changes that --force deletes too: %s' "$dirty"
}

summary() {
    local heading=$1 repo=$2 base source count
    base=$(git -C "$repo" config --get "branch.$BRANCH.zero3base")
    source=$(git -C "$repo" config --get "branch.$BRANCH.zero3source" || echo '?')
    count=$(git -C "$repo" rev-list --count "$base..refs/heads/$BRANCH")
    printf '%s\n' "$heading"
    printf '  path:    %s\n' "$repo"
    printf '  branch:  %s\n' "$BRANCH"
    printf '  source:  %s\n' "$source"
    if ((PIN_BY_SDIST_ONLY)); then
        printf '  base:    %s (%s, sdist sha256 %s)\n' "$base" "$VERSION" "$PIN_SHA"
    else
        printf '  base:    %s (upstream %s = %s)\n' "$base" "$VERSION" "$PIN_COMMIT"
    fi
    printf '  commits: %s applied, oldest first\n' "$count"
    git -C "$repo" log --reverse --format='    %h %s' "$base..refs/heads/$BRANCH"
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum -- "$1" | cut -d' ' -f1
    else
        shasum -a 256 -- "$1" | cut -d' ' -f1
    fi
}

# Runs git with a bounded, non-interactive network: an unreachable host must fail in seconds,
# not hang on a prompt or on a stalled transfer.
net_git() {
    local limit=$1
    shift
    GIT_TERMINAL_PROMPT=0 GIT_HTTP_LOW_SPEED_LIMIT=1000 GIT_HTTP_LOW_SPEED_TIME=15 \
        GIT_SSH_COMMAND=${GIT_SSH_COMMAND:-ssh -o BatchMode=yes -o ConnectTimeout=15} \
        timeout "$limit" git "$@"
}

# ---------------------------------------------------------------------------------------------
# Sources. Each fills the repository at $1 (which must not exist yet) with the pinned base,
# checked out on branch $BRANCH, and sets BASE and SOURCE_DESC; or it sets FAIL_REASON when the
# source is unavailable. Verification failures exit at once. They signal through FAIL_REASON, not
# their status, because bash ignores `set -e` inside a function called as a condition.

BASE='' SOURCE_DESC='' FAIL_REASON='' REPLACED=''

from_git() {
    local repo=$1 url=${DEEPSPEED_GIT_URL:-$DEFAULT_GIT_URL} out found
    if ((PIN_BY_SDIST_ONLY)); then
        FAIL_REASON="$VERSION is pinned by its sdist only (no upstream commit in $PINNED_FILE), so a clone cannot be verified"
        return 0
    fi
    info "trying git: $url"
    # Ask the remote for the tag first: cheap, fails fast when offline, and lets us check the
    # tag before downloading anything.
    if ! out=$(net_git "${DEEPSPEED_GIT_PROBE_TIMEOUT:-20}" ls-remote --tags -- "$url" \
        "refs/tags/$VERSION" "refs/tags/$VERSION^{}" 2>&1); then
        FAIL_REASON="git ls-remote $url failed: $(printf '%s' "$out" | tail -n 1)"
        return 0
    fi
    found=$(printf '%s\n' "$out" | awk -v t="refs/tags/$VERSION^{}" '$2 == t {print $1}')
    [[ -n $found ]] || found=$(printf '%s\n' "$out" | awk -v t="refs/tags/$VERSION" '$2 == t {print $1}')
    if [[ -z $found ]]; then
        FAIL_REASON="tag $VERSION not found at $url"
        return 0
    fi
    [[ $found == "$PIN_COMMIT" ]] || die "$E_VERIFY" "base verification failed: tag $VERSION at $url is commit $found, expected pinned commit $PIN_COMMIT"
    if ! out=$(net_git "${DEEPSPEED_GIT_TIMEOUT:-900}" -c advice.detachedHead=false clone -q \
        --no-checkout --depth 1 --branch "$VERSION" -- "$url" "$repo" 2>&1); then
        rm -rf -- "$repo"
        FAIL_REASON="git clone of $url failed: $(printf '%s' "$out" | tail -n 1)"
        return 0
    fi
    found=$(git -C "$repo" rev-parse -q --verify "refs/tags/$VERSION^{commit}" || echo none)
    [[ $found == "$PIN_COMMIT" ]] || die "$E_VERIFY" "base verification failed: tag $VERSION in the clone of $url is commit $found, expected pinned commit $PIN_COMMIT"
    git -C "$repo" checkout -q -b "$BRANCH" "$PIN_COMMIT"
    BASE=$PIN_COMMIT
    SOURCE_DESC="git clone of $url (tag $VERSION verified)"
}

find_sdist() {
    local cand d
    cand=${SDIST_ARG:-${DEEPSPEED_SDIST:-}}
    if [[ -n $cand ]]; then
        if [[ -f $cand ]]; then
            SDIST_FILE=$cand
        elif [[ -d $cand && -f $cand/$PIN_SDIST ]]; then
            SDIST_FILE=$cand/$PIN_SDIST
        elif [[ -d $cand ]]; then
            FAIL_REASON="no $PIN_SDIST in directory $cand"
            return 0
        else
            FAIL_REASON="sdist path $cand does not exist"
            return 0
        fi
        return 0
    fi
    # An offline host's wheelhouse (PIP_FIND_LINKS) is where build-wheelhouse.sh puts the sdist.
    for d in ${PIP_FIND_LINKS:-}; do
        d=${d#file://}
        if [[ -f $d/$PIN_SDIST ]]; then
            SDIST_FILE=$d/$PIN_SDIST
            return 0
        fi
    done
    local py=${PYTHON:-python3} log=$TMP/pip-download.log
    info "downloading $PIN_SDIST with pip"
    if ! "$py" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
        "deepspeed==${VERSION#v}" -d "$TMP/sdist" >"$log" 2>&1; then
        FAIL_REASON="pip download deepspeed==${VERSION#v} failed: $(tail -n 1 "$log")"
        return 0
    fi
    if [[ ! -f $TMP/sdist/$PIN_SDIST ]]; then
        FAIL_REASON="pip download did not produce $PIN_SDIST"
        return 0
    fi
    SDIST_FILE=$TMP/sdist/$PIN_SDIST
}

from_sdist() {
    local repo=$1 found top entries bad
    SDIST_FILE=
    find_sdist
    [[ -z $FAIL_REASON ]] || return 0
    info "using sdist $SDIST_FILE"
    found=$(sha256_of "$SDIST_FILE")
    [[ $found == "$PIN_SHA" ]] || die "$E_VERIFY" "base verification failed: sha256 of $SDIST_FILE is $found, expected $PIN_SHA"
    # Everything must sit under the one top directory the sdist is named after, so that
    # --strip-components cannot drop or misplace files.
    top=${PIN_SDIST%.tar.gz}
    entries=$(tar -tzf "$SDIST_FILE") || die "$E_VERIFY" "cannot list $SDIST_FILE (corrupt archive?)"
    bad=$(printf '%s\n' "$entries" | awk -v t="$top" '$0 != t && $0 != t "/" && index($0, t "/") != 1' | head -n 1)
    [[ -z $bad ]] || die "$E_VERIFY" "base verification failed: $SDIST_FILE has an entry outside $top/: $bad"
    mkdir -- "$repo"
    # --no-same-owner: as root, tar would otherwise keep the packager's uid and git would then
    # refuse the tree as "dubious ownership".
    tar -xzf "$SDIST_FILE" --no-same-owner --strip-components=1 -C "$repo"
    local msg=$TMP/import-message
    # The line is the same as before for bases with a pinned commit, so their import commit ids
    # (which README.md quotes) do not change.
    local UPSTREAM_LINE="Upstream-commit: $PIN_COMMIT"
    ((PIN_BY_SDIST_ONLY)) && UPSTREAM_LINE="Upstream-commit: not pinned; the sdist sha256 below identifies the release"
    cat >"$msg" <<EOF
Import DeepSpeed $VERSION from the PyPI sdist $PIN_SDIST

The tree is the sdist unpacked as it is; the sdist has no tests/ directory.
scripts/apply.sh fixes this commit's author, committer, dates and message,
so the same sdist gives the same commit id on every machine.

${UPSTREAM_LINE}
Sdist: $PIN_SDIST
Sdist-sha256: $PIN_SHA
EOF
    # The user's global and system git config (autocrlf, attributes, excludes, hooks) must not
    # change what gets committed: the commit id has to be the same everywhere.
    # shellcheck disable=SC2030  # the fixed identity is meant for this subshell only
    (
        export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
        export GIT_AUTHOR_NAME=$IMPORT_NAME GIT_AUTHOR_EMAIL=$IMPORT_EMAIL GIT_AUTHOR_DATE=$IMPORT_DATE
        export GIT_COMMITTER_NAME=$IMPORT_NAME GIT_COMMITTER_EMAIL=$IMPORT_EMAIL GIT_COMMITTER_DATE=$IMPORT_DATE
        cd -- "$repo"
        git init -q
        git symbolic-ref HEAD "refs/heads/$BRANCH"
        git -c core.autocrlf=false -c core.safecrlf=false -c core.fileMode=true add -A -f .
        tree=$(git write-tree)
        commit=$(git commit-tree "$tree" -F "$msg")
        git update-ref "refs/heads/$BRANCH" "$commit"
        # A name for the base, handy for `git rebase -i` and `git log` in this checkout.
        git tag "zero3-base/$VERSION" "$commit"
    )
    SOURCE_DESC="sdist $PIN_SDIST (sha256 verified)"
    info "sha256 $PIN_SHA verified; imported as commit $(git -C "$repo" rev-parse HEAD)"
    [[ -z $PIN_TESTS ]] || import_upstream_tests "$repo"
    BASE=$(git -C "$repo" rev-parse HEAD)
}

# The sdist has no tests/, and a series whose tests extend upstream's own test files needs them:
# a pinned snapshot of upstream's tests/ (pinned-bases.tsv, fields 5 and 6) is committed on top of
# the sdist import, with the same fixed identity, so the base stays the same on every machine.
import_upstream_tests() {
    local repo=$1 found cand snapshot=''
    # An offline host's wheelhouse (PIP_FIND_LINKS) may carry it, as it carries the sdist.
    for cand in "${ZERO3_UPSTREAM_TESTS:-}" "$REPO_ROOT/../shared/upstream-tests" ${PIP_FIND_LINKS:-}; do
        cand=${cand#file://}
        [[ -n $cand ]] || continue
        [[ -d $cand ]] && cand=$cand/$PIN_TESTS
        if [[ -f $cand && ${cand##*/} == "$PIN_TESTS" ]]; then
            snapshot=$cand
            break
        fi
    done
    [[ -n $snapshot ]] || die "$E_NOBASE" "the $VERSION series changes upstream's own tests/, which the PyPI sdist lacks: set ZERO3_UPSTREAM_TESTS to $PIN_TESTS (sha256 $PIN_TESTS_SHA) or the directory holding it (looked in ${ZERO3_UPSTREAM_TESTS:+$ZERO3_UPSTREAM_TESTS, }$REPO_ROOT/../shared/upstream-tests${PIP_FIND_LINKS:+ and PIP_FIND_LINKS})"
    found=$(sha256_of "$snapshot")
    [[ $found == "$PIN_TESTS_SHA" ]] || die "$E_VERIFY" "base verification failed: sha256 of $snapshot is $found, expected $PIN_TESTS_SHA"
    [[ -z $(tar -tzf "$snapshot" | grep -v '^tests/' | head -n 1) ]] ||
        die "$E_VERIFY" "base verification failed: $snapshot has entries outside tests/"
    tar -xzf "$snapshot" --no-same-owner -C "$repo"
    # shellcheck disable=SC2030  # the fixed identity is meant for this subshell only
    (
        export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
        export GIT_AUTHOR_NAME=$IMPORT_NAME GIT_AUTHOR_EMAIL=$IMPORT_EMAIL GIT_AUTHOR_DATE=$IMPORT_DATE
        export GIT_COMMITTER_NAME=$IMPORT_NAME GIT_COMMITTER_EMAIL=$IMPORT_EMAIL GIT_COMMITTER_DATE=$IMPORT_DATE
        cd -- "$repo"
        git -c core.autocrlf=false -c core.safecrlf=false -c core.fileMode=true add -A -f tests
        git commit -q --no-verify -F - <<EOF2
Add upstream's tests/ from the snapshot $PIN_TESTS

The sdist has no tests/; the series extends upstream's own test files.
This commit adds upstream's tests/ directory as the snapshot holds it.

Tests-snapshot: $PIN_TESTS
Tests-snapshot-sha256: $PIN_TESTS_SHA
EOF2
        git tag -f "zero3-base/$VERSION" HEAD >/dev/null
    )
    SOURCE_DESC+=", upstream tests/ from $PIN_TESTS (sha256 verified)"
    info "sha256 $PIN_TESTS_SHA verified; upstream's tests/ added as commit $(git -C "$repo" rev-parse HEAD)"
}

# ---------------------------------------------------------------------------------------------
# Applying the series

ensure_identity() {
    local repo=$1
    # An identity given in the environment (scripts/prepare-submission.sh) commits; config is not needed.
    [[ -z ${GIT_COMMITTER_NAME:-} || -z ${GIT_COMMITTER_EMAIL:-} ]] || return 0
    if ! git -C "$repo" config --get user.name >/dev/null || ! git -C "$repo" config --get user.email >/dev/null; then
        git -C "$repo" config user.name "$FALLBACK_NAME"
        git -C "$repo" config user.email "$FALLBACK_EMAIL"
        info "no git identity configured: set $FALLBACK_NAME <$FALLBACK_EMAIL> in $repo"
    fi
}

# with_author REPO PATCH: print PATCH with an author for `git am`: the identity that commits in
# REPO, when the patch names none (scripts/patch-author.awk says why).
with_author() {
    local repo=$1 patch=$2 ident
    ident=$(git -C "$repo" var GIT_COMMITTER_IDENT) || die "$E_INTERNAL" "no git identity to author $patch with"
    awk -v from="From: ${ident% * *}" -f "$SCRIPT_DIR/patch-author.awk" "$patch"
}

# apply_series REPO [GIT_OPTION...]: git am every patch of SERIES in REPO, or exit E_PATCH.
apply_series() {
    local repo=$1 i p out files
    shift
    for ((i = 0; i < ${#SERIES[@]}; i++)); do
        p=${SERIES[i]}
        # Options are spelled out so that am.* / apply.* settings in the user's config cannot
        # change what gets committed (3-way merges, whitespace fixing, CR handling).
        if ! out=$(with_author "$repo" "$PATCH_DIR/$p" | git -C "$repo" "$@" am --no-3way --no-scissors \
            --no-keep-cr --no-message-id --whitespace=warn --committer-date-is-author-date 2>&1); then
            # the clean-up (rollback) aborts the am and says what it left
            # git am's advice (--continue, --skip, --abort, --show-current-patch) is about an am that
            # was aborted just now, and its "Patch failed at 0001" counts within this one-patch am.
            printf '%s\n' "$out" | grep -v -e '^hint:' -e 'git am --' -e '^Patch failed at ' |
                sed 's/^/  git am: /' >&2 || true
            files=$(printf '%s\n' "$out" | sed -n \
                -e 's/^error: patch failed: \(.*\):[0-9][0-9]*$/\1/p' \
                -e 's/^error: \(.*\): \(patch does not apply\|does not exist in index\|already exists in index\|already exists in working directory\|does not match index\|No such file or directory\)$/\1/p' |
                sort -u | paste -sd, - | sed 's/,/, /g')
            die "$E_PATCH" "patch $p ($((i + 1)) of ${#SERIES[@]}) did not apply to $VERSION; failing file(s): ${files:-unknown, see the git am output above}"
        fi
    done
}

record() {
    local repo=$1 source=$2
    git -C "$repo" config "branch.$BRANCH.zero3version" "$VERSION"
    git -C "$repo" config "branch.$BRANCH.zero3upstream" "$PIN_COMMIT"
    git -C "$repo" config "branch.$BRANCH.zero3base" "$BASE"
    git -C "$repo" config "branch.$BRANCH.zero3source" "$source"
}

# ---------------------------------------------------------------------------------------------
# Mode 0: --onto, the series onto a branch of the user's fork
#
# A fork clone lacks the blobs the series' patches were made against (the sdist import, the
# intermediate states), so `git am --3way` cannot fall back to a merge there. Instead the patched
# tree is built here from the verified base, its commits are fetched into the fork, and each is
# cherry-picked: a cherry-pick is a real 3-way merge whose base (the commit's parent) the fork now
# has, so a change of the fork's own next to the series' merges, and one on the same lines is an
# ordinary conflict that git's own --continue / --abort handle.

onto_fork() {
    local fork tip old_head version_txt tree series_ref base todo=() skipped=() c subj have n i
    [[ -d $CHECKOUT ]] || die "$E_CHECKOUT" "fork $CHECKOUT is not a directory"
    fork=$(git -C "$CHECKOUT" rev-parse --show-toplevel 2>/dev/null) ||
        die "$E_CHECKOUT" "$CHECKOUT is not a git checkout; run apply.sh from your DeepSpeed clone or name it with --checkout FORK"
    tip=$(git -C "$fork" rev-parse -q --verify "refs/heads/$ONTO^{commit}") ||
        die "$E_CHECKOUT" "branch $ONTO does not exist in $fork (git -C $fork branch lists the branches)"
    [[ -z $(in_progress "$fork") ]] ||
        die "$E_CHECKOUT" "$fork is in the middle of a git operation ($(in_progress "$fork")); finish or abort it first"
    [[ -z $(git -C "$fork" status --porcelain --untracked-files=no) ]] ||
        die "$E_CHECKOUT" "$fork has uncommitted changes; commit or stash them first"
    version_txt=$(git -C "$fork" show "$tip:version.txt" 2>/dev/null | head -n 1 | tr -d '[:space:]') || version_txt=''
    if [[ v$version_txt != "$VERSION" ]]; then
        ((FORCE)) || die "$E_VERIFY" "branch $ONTO of $fork is DeepSpeed ${version_txt:-of unknown version (no version.txt)}, not $VERSION: bring the series of its own release (pinned:${KNOWN}), see docs/guide/forks.md for a fork between releases; --force applies the $VERSION series anyway"
        info "--force: $ONTO is DeepSpeed ${version_txt:-(no version.txt)}, applying the $VERSION series anyway"
    fi

    # The patched tree, from the verified base, as a run without --onto makes it.
    tree=$TMP/series-tree
    local build=(bash "$SCRIPT_DIR/apply.sh" "$VERSION" --dest "$tree" --patch-dir "$PATCH_DIR" --patches "$N_PATCHES")
    [[ $SOURCE == auto ]] || build+=(--source "$SOURCE")
    [[ -z $SDIST_ARG ]] || build+=(--sdist "$SDIST_ARG")
    "${build[@]}" >"$TMP/build.out" || exit $?
    base=$(git -C "$tree" config --get "branch.$BRANCH.zero3base")
    series_ref=refs/zero3/$VERSION
    git -C "$fork" fetch -q --no-tags "$tree" "+refs/heads/$BRANCH:$series_ref"
    info "fetched the $VERSION series ($N_PATCHES patch(es) on the verified base $base) into $fork as $series_ref"

    # A patch whose subject BRANCH already has was brought over before (a conflict resolved by hand
    # changes its diff, not its subject): skip it, so that a second run only adds what is missing.
    have=$(git -C "$fork" log --no-merges --format=%s "$tip")
    for c in $(git -C "$fork" rev-list --reverse "$base..$series_ref"); do
        subj=$(git -C "$fork" log -1 --format=%s "$c")
        if grep -qxF -- "$subj" <<<"$have"; then skipped+=("$c"); else todo+=("$c"); fi
    done
    ((${#skipped[@]} == 0)) || info "${#skipped[@]} patch(es) of the series are on $ONTO already (same subject): skipped"
    if ((${#todo[@]} == 0)); then
        printf 'already applied: all %s patch(es) of the %s series are on branch %s of %s (at %s)\n' \
            "$N_PATCHES" "$VERSION" "$ONTO" "$fork" "$(git -C "$fork" rev-parse --short "$tip")"
        return 0
    fi

    old_head=$(git -C "$fork" symbolic-ref -q --short HEAD || git -C "$fork" rev-parse HEAD)
    if [[ $old_head != "$ONTO" ]]; then
        git -C "$fork" switch -q "$ONTO"
        info "switched $fork from $old_head to $ONTO"
    fi
    if ! git -C "$fork" config --get user.name >/dev/null || ! git -C "$fork" config --get user.email >/dev/null; then
        # Never write into the user's config: the identity is given to this run only.
        export GIT_COMMITTER_NAME=${GIT_COMMITTER_NAME:-$FALLBACK_NAME} GIT_COMMITTER_EMAIL=${GIT_COMMITTER_EMAIL:-$FALLBACK_EMAIL}
    fi
    local undo="git -C $fork reset --keep $(git -C "$fork" rev-parse --short "$tip")"
    # Where the series starts on BRANCH, for the tools that run the tests it adds (tests/upstream_suite.py
    # diffs branch.BRANCH.zero3base..HEAD, as on apply.sh's own branches); no zero3version is written, so
    # BRANCH never counts as a branch apply.sh created and may re-create.
    git -C "$fork" config --get "branch.$ONTO.zero3base" >/dev/null ||
        git -C "$fork" config "branch.$ONTO.zero3base" "$tip"
    if git -C "$fork" cherry-pick "${todo[@]}" >"$TMP/pick.out" 2>&1; then
        n=${#todo[@]}
        printf 'brought %s patch(es) of the %s series onto branch %s of %s\n' "$n" "$VERSION" "$ONTO" "$fork"
        printf '  fork:    %s\n  branch:  %s (was %s; your commits are kept below the series)\n' \
            "$fork" "$ONTO" "$(git -C "$fork" rev-parse --short "$tip")"
        printf '  series:  %s (%s on the verified %s base %s)\n' "$series_ref" "$N_PATCHES patch(es)" "$VERSION" "$base"
        printf '  commits: %s added, oldest first\n' "$n"
        git -C "$fork" log --reverse --format='    %h %s' "$tip..refs/heads/$ONTO"
        printf '  undo:    %s\n' "$undo"
        return 0
    fi
    # git's own report of the commits it made is left out: what matters is where and why it stopped
    grep -E '^(CONFLICT|error|fatal|warning)' "$TMP/pick.out" | sed 's/^/  git cherry-pick: /' >&2 || true
    local op stopped files done_n
    op=$(in_progress "$fork")
    done_n=$(git -C "$fork" rev-list --count "$tip..HEAD")
    if [[ $op == CHERRY_PICK_HEAD || $op == sequencer ]] &&
        stopped=$(git -C "$fork" rev-parse -q --verify CHERRY_PICK_HEAD); then
        i=0
        for c in "${todo[@]}"; do
            i=$((i + 1))
            [[ $c == "$stopped" ]] && break
        done
        files=$(git -C "$fork" diff --name-only --diff-filter=U | paste -sd, - | sed 's/,/, /g')
        {
            printf '%s: patch %s of %s to bring, "%s", conflicts with branch %s in: %s\n' "$PROG" "$i" "${#todo[@]}" \
                "$(git -C "$fork" log -1 --format=%s "$stopped")" "$ONTO" "${files:-see git status}"
            printf '%s: %s is in the middle of a git cherry-pick (git status shows it); %s patch(es) before it are on %s.\n' \
                "$PROG" "$fork" "$done_n" "$ONTO"
            printf '  to resume: fix the conflicts in the files above, then\n'
            printf '      git -C %s add %s\n' "$fork" "$(git -C "$fork" diff --name-only --diff-filter=U | paste -sd' ' -)"
            printf '      git -C %s cherry-pick --continue    # goes on with the rest; repeat for a later conflict\n' "$fork"
            printf '  to abort:  git -C %s cherry-pick --abort       # %s back at %s, as before this run\n' "$fork" "$ONTO" \
                "$(git -C "$fork" rev-parse --short "$tip")"
            printf '  after resuming, run apply.sh again (the same command): it says "already applied" or adds what is missing.\n'
        } >&2
        exit "$E_CONFLICT"
    fi
    if [[ -n $op ]]; then
        die "$E_PATCH" "git cherry-pick failed (output above); $fork is in the middle of a git operation ($op): git -C $fork cherry-pick --abort returns $ONTO to $(git -C "$fork" rev-parse --short "$tip")"
    fi
    ((done_n == 0)) && die "$E_PATCH" "git cherry-pick failed (output above) before it changed anything: $ONTO is unchanged, no operation is in progress"
    die "$E_PATCH" "git cherry-pick failed (output above) with no operation in progress; $ONTO holds $done_n of the ${#todo[@]} patch(es): $undo returns it to where it was"
}

if [[ -n $ONTO ]]; then
    onto_fork
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# Mode 1: the user's own checkout

if [[ $SOURCE == checkout ]]; then
    ((PIN_BY_SDIST_ONLY)) &&
        die "$E_NOBASE" "$VERSION is pinned by its sdist only (no upstream commit in $PINNED_FILE), so apply.sh cannot verify a checkout's tag; apply $PATCH_DIR/series by hand with git am (see docs/guide/cherry-pick.md), or build from the sdist without --checkout"
    [[ -d $CHECKOUT ]] || die "$E_CHECKOUT" "--checkout $CHECKOUT is not a directory"
    top=$(git -C "$CHECKOUT" rev-parse --show-toplevel 2>/dev/null) ||
        die "$E_CHECKOUT" "--checkout $CHECKOUT is not a git checkout"
    if git -C "$top" show-ref --verify --quiet "refs/heads/$BRANCH"; then
        if [[ -z $(git -C "$top" config --get "branch.$BRANCH.zero3version" || true) ]]; then
            die "$E_CHECKOUT" "branch $BRANCH already exists in $top and was not created by apply.sh; choose another with --branch NAME"
        fi
        if same_request "$top"; then
            summary "already applied: $VERSION with ${#SERIES[@]} patch(es) on branch $BRANCH of $top" "$top"
            exit 0
        fi
        ((FORCE)) || die "$E_DIFFERENT" "branch $BRANCH in $top holds $(describe_state "$top"), not $VERSION with the ${#SERIES[@]} requested patch(es); re-run with --force to re-create the branch ($(force_loss "$top" "$BRANCH"))"
        REPLACED="branch $BRANCH (it held $(describe_state "$top") at $(git -C "$top" rev-parse --short "refs/heads/$BRANCH"); $(force_loss "$top" "$BRANCH"))"
    fi
    [[ -z $(git -C "$top" status --porcelain --untracked-files=no) ]] ||
        die "$E_CHECKOUT" "checkout $top has uncommitted changes; commit or stash them first"
    [[ -z $(in_progress "$top") ]] ||
        die "$E_CHECKOUT" "checkout $top is in the middle of a git operation ($(in_progress "$top")); finish or abort it first"
    if git -C "$top" rev-parse -q --verify "refs/tags/$VERSION" >/dev/null; then
        found=$(git -C "$top" rev-parse -q --verify "refs/tags/$VERSION^{commit}" || echo none)
        [[ $found == "$PIN_COMMIT" ]] || die "$E_VERIFY" "base verification failed: tag $VERSION in $top is commit $found, expected pinned commit $PIN_COMMIT"
    elif ! git -C "$top" cat-file -e "$PIN_COMMIT^{commit}" 2>/dev/null; then
        die "$E_NOBASE" "pinned commit $PIN_COMMIT ($VERSION) is not in $top; fetch it first: git -C $top fetch ${DEEPSPEED_GIT_URL:-$DEFAULT_GIT_URL} tag $VERSION"
    fi
    CO_ORIG=$(git -C "$top" symbolic-ref -q --short HEAD || git -C "$top" rev-parse HEAD)
    CO=$top
    # Work on a temporary branch and rename it at the end: a failure then never costs the user
    # a branch, not even the one --force is about to replace.
    tmpb="$BRANCH-apply-tmp-$$"
    git -C "$top" checkout -q -b "$tmpb" "$PIN_COMMIT"
    CO_TMP_BRANCH=$tmpb
    BASE=$PIN_COMMIT
    if ! git -C "$top" config --get user.name >/dev/null || ! git -C "$top" config --get user.email >/dev/null; then
        # Never write into the user's config: the identity is given to this run only.
        # shellcheck disable=SC2031
        export GIT_COMMITTER_NAME=$FALLBACK_NAME GIT_COMMITTER_EMAIL=$FALLBACK_EMAIL
    fi
    apply_series "$top"
    if git -C "$top" show-ref --verify --quiet "refs/heads/$BRANCH"; then
        info "--force: replacing $REPLACED"
        git -C "$top" config --remove-section "branch.$BRANCH" 2>/dev/null || true
    fi
    git -C "$top" branch -q -M "$tmpb" "$BRANCH"
    CO_TMP_BRANCH=
    record "$top" "your checkout $top (commit verified)"
    summary "patched DeepSpeed $VERSION: branch $BRANCH in your checkout $top" "$top"
    if [[ $CO_ORIG == "$BRANCH" ]]; then
        info "the HEAD of $top was on $BRANCH and stays on it, now the re-created branch"
    else
        if git -C "$top" show-ref --verify --quiet "refs/heads/$CO_ORIG"; then
            back="git -C $top switch $CO_ORIG"
        else
            back="git -C $top switch --detach $CO_ORIG"
        fi
        info "switched the HEAD of $top from $CO_ORIG to the new branch $BRANCH; to go back: $back"
    fi
    config=$(git -C "$top" rev-parse --git-path config)
    [[ $config == /* ]] || config=$top/$config
    info "wrote branch.$BRANCH.zero3version, .zero3upstream, .zero3base and .zero3source to $config (apply.sh's record of the branch; git branch -D $BRANCH removes them)"
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# Mode 2: a destination directory this script owns

DEST=${DEST:-$REPO_ROOT/build/deepspeed-$VERSION}
[[ $DEST == /* ]] || DEST=$PWD/$DEST
while [[ $DEST == */ && $DEST != / ]]; do DEST=${DEST%/}; done
[[ $DEST != / ]] || die "$E_USAGE" "--dest / is not allowed"

if [[ -e $DEST || -L $DEST ]]; then
    if [[ ! -d $DEST || -L $DEST || ! -f $DEST/.git/$MARKER_NAME ]]; then
        die "$E_FOREIGN" "destination $DEST exists and was not created by apply.sh; choose another --dest or remove it yourself"
    fi
    marker_branch=$(sed -n 's/^branch=//p' "$DEST/.git/$MARKER_NAME" | head -n 1)
    if [[ $marker_branch == "$BRANCH" &&
        $(git -C "$DEST" symbolic-ref -q HEAD || true) == "refs/heads/$BRANCH" ]] && same_request "$DEST"; then
        summary "already applied: $VERSION with ${#SERIES[@]} patch(es) at $DEST" "$DEST"
        git -C "$DEST" diff --quiet HEAD -- 2>/dev/null ||
            info "note: $DEST has uncommitted changes (a pip install in place rewrites deepspeed/git_version_info_installed.py)"
        exit 0
    fi
    ((FORCE)) || die "$E_DIFFERENT" "destination $DEST was created by apply.sh but holds $(BRANCH=${marker_branch:-$BRANCH} describe_state "$DEST") (branch ${marker_branch:-?}), not $VERSION with the ${#SERIES[@]} requested patch(es); re-run with --force to re-create it ($(force_loss "$DEST" "${marker_branch:-$BRANCH}" "$DEST"))"
    REPLACED="$DEST (it held $(BRANCH=${marker_branch:-$BRANCH} describe_state "$DEST") on branch ${marker_branch:-?} at $(git -C "$DEST" rev-parse --short HEAD 2>/dev/null || echo '?'); $(force_loss "$DEST" "${marker_branch:-$BRANCH}" "$DEST"))"
fi

# Create missing parents, remembering which, so a failed run can remove exactly those.
parent=$(dirname -- "$DEST")
missing=()
d=$parent
while [[ ! -e $d ]]; do
    missing=("$d" "${missing[@]}")
    d=$(dirname -- "$d")
done
for d in "${missing[@]}"; do
    mkdir -- "$d"
    CREATED_DIRS+=("$d")
done
[[ -d $parent ]] || die "$E_USAGE" "parent of --dest is not a directory: $parent"

# Build next to the destination and rename at the end: a failure leaves no half-patched tree,
# and --force only replaces the old tree once the new one is complete.
WORK=$parent/.$(basename -- "$DEST").apply-tmp.$$
got=0
reasons=()
case $SOURCE in
    auto) candidates=(git sdist) ;;
    *) candidates=("$SOURCE") ;;
esac
for s in "${candidates[@]}"; do
    FAIL_REASON=
    "from_$s" "$WORK"
    if [[ -z $FAIL_REASON ]]; then
        got=1
        break
    fi
    reasons+=("$s: $FAIL_REASON")
    info "source $s unavailable: $FAIL_REASON"
done
((got)) || die "$E_NOBASE" "no source could provide the $VERSION base (${reasons[*]})"
info "base from $SOURCE_DESC"

ensure_identity "$WORK"
# In a tree of our own, commit signing and the user's global hooks would only make the commit
# ids differ between machines (or fail for want of a key).
apply_series "$WORK" -c commit.gpgSign=false -c core.hooksPath=/dev/null
record "$WORK" "$SOURCE_DESC"
printf '# Created by scripts/apply.sh; apply.sh --force may delete this whole directory.\nversion=%s\nbranch=%s\n' \
    "$VERSION" "$BRANCH" >"$WORK/.git/$MARKER_NAME"

if [[ -e $DEST ]]; then
    # Only reached with --force on a destination whose marker was checked above.
    info "--force: replacing $REPLACED"
    rm -rf -- "$DEST"
fi
mv -- "$WORK" "$DEST"
WORK=
summary "patched DeepSpeed $VERSION at $DEST" "$DEST"
