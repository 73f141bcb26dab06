#!/usr/bin/env bash
# Carry the series of one pinned release (default v0.19.2) to another pinned release, patch by
# patch, with real 3-way merges, and export the result to patches/VERSION/.
# Run `scripts/port-series.sh --help` for usage.
set -Eeuo pipefail

PROG=port-series.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/port-series.sh VERSION [--from FROM] [--continue | --finish | --abort]

Port the series of FROM (default v0.19.2, the source of truth) to the pinned release VERSION
and export it to patches/VERSION/:

  1. scripts/apply.sh FROM builds build/port/FROM (FROM + its series); apply.sh VERSION
     --pristine builds build/port/VERSION (branch zero3/VERSION, the sdist import commit as base).
  2. The FROM series is fetched into build/port/VERSION and cherry-picked onto VERSION one patch
     at a time. Cherry-pick merges three ways with each patch's own parent as the merge base, so
     git has every blob it needs although the two bases are unrelated commits.
  3. On a conflict it stops and says where. Resolve it in build/port/VERSION as a port (the same
     behaviour, written for VERSION's code), `git add` the files, describe the adaptation in
     patches/VERSION/port-notes.txt, then run `scripts/port-series.sh VERSION --continue`.
  4. When every patch is in, each commit gets a paragraph after its FROM message, before the
     trailers, that says how it relates to the FROM patch:
       Backport to VERSION of the FROM patch (git patch-id 0123456789ab): ...
     It is computed: "unchanged" (the FROM patch applies without a merge), "merged" (the same
     added and removed lines, only the context differs: a 3-way merge), or, when the added or
     removed lines differ, "adapted:" and the note for that patch from
     patches/VERSION/port-notes.txt, which is then required (and a note for a patch that is
     not adapted is refused: it would describe a port that no longer exists). Then scripts/export-patches.sh writes patches/VERSION/ (cover letter
     text: patches/VERSION/cover-letter.txt, which must exist).

You may change commits in build/port/VERSION after a run (git commit --amend, git rebase -i
zero3-base/VERSION; keep one commit per FROM patch, in order) and then run --finish, which
recomputes the paragraphs and exports again.

patches/VERSION/port-notes.txt: one block per FROM patch that needed adapting:
  == <subject of the FROM patch, as in its Subject line without [PATCH n/m]>
  <paragraph: what differs in VERSION and how the port does the same thing there>
Lines starting with # are comments. Notes of subjects not in the FROM series are an error.

Options:
  --from FROM   release whose series is ported (default v0.19.2)
  --continue    after resolving a conflict: finish the cherry-pick and go on
  --finish      recompute the backport paragraphs of build/port/VERSION and export
  --abort       stop a port in progress (build/port/VERSION is left as it is; the next run
                re-creates it)
  -h, --help    show this help

Environment: DEEPSPEED_SDIST and the others of scripts/apply.sh (it builds both trees).
Exit codes: 0 ported and exported, 1 internal error, 2 malformed command line, 3 a pinned base
or series problem (apply.sh's message is shown), 4 stopped on a conflict, 5 a port note is
missing or stale, 6 no port in progress (--continue) or one in progress (a new run).
EOF
}

die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}
info() { printf '%s: %s\n' "$PROG" "$*" >&2; }
trap 'die 1 "internal error: command failed (status $?) at line $LINENO: $BASH_COMMAND"' ERR

VERSION='' FROM=v0.19.2 MODE=start
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --from)
            (($# >= 2)) && [[ -n $2 ]] || die 2 "option --from needs a value"
            FROM=$2
            shift
            ;;
        --continue) MODE=continue ;;
        --finish) MODE=finish ;;
        --abort) MODE=abort ;;
        -*) die 2 "unknown option '$1' (see --help)" ;;
        *)
            [[ -z $VERSION ]] || die 2 "more than one VERSION given ('$VERSION' and '$1')"
            VERSION=$1
            ;;
    esac
    shift
done
[[ -n $VERSION ]] || die 2 "missing VERSION argument, e.g. v0.19.1 (see --help)"
for v in "$VERSION" "$FROM"; do
    [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die 2 "malformed version '$v' (expected a release tag like v0.19.1)"
done
[[ $VERSION != "$FROM" ]] || die 2 "VERSION and --from are the same release ($VERSION)"

PORT_DIR=$REPO_ROOT/build/port
SRC=$PORT_DIR/$FROM
TREE=$PORT_DIR/$VERSION
BRANCH=zero3/$VERSION
OUT=$REPO_ROOT/patches/$VERSION
NOTES=$OUT/port-notes.txt
STATE=$TREE/.git/zero3-port
FROM_REF=refs/zero3-port/from

g() { git -C "$TREE" -c commit.gpgSign=false -c core.hooksPath=/dev/null "$@"; }

state_get() { sed -n "s/^$1=//p" "$STATE" 2>/dev/null | head -n 1; }

# The FROM commits, oldest first, as fetched into TREE.
from_commits() {
    g rev-list --reverse "$(state_get from_base)..$FROM_REF"
}

subject_of() { g log -1 --format=%s "$1"; }

# Added and removed lines of a commit, file by file, without context or line numbers: two
# commits with the same output make the same change.
change_lines() {
    g -c diff.renames=true show --format= --no-color --unified=0 "$1" | awk '
        /^diff --git / { print; next }
        /^(\+\+\+|---) / { next }
        /^[-+]/ { print }'
}

# Does the FROM commit's diff apply to PARENT without a merge (offsets allowed)?
applies_plainly() {
    local from=$1 parent=$2 idx rc=0
    idx=$(mktemp "${TMPDIR:-/tmp}/zero3-port-index.XXXXXX")
    GIT_INDEX_FILE=$idx g read-tree "$parent"
    g diff --binary "$from^" "$from" | GIT_INDEX_FILE=$idx g apply --cached --check - 2>/dev/null || rc=1
    rm -f -- "$idx"
    return $rc
}

# note_for SUBJECT: the paragraph under "== SUBJECT" in port-notes.txt (empty if none).
note_for() {
    [[ -f $NOTES ]] || return 0
    awk -v want="$1" '
        /^#/ { next }
        /^== / { on = (substr($0, 4) == want); next }
        on && NF { printf "%s%s", sep, $0; sep = " " }
        END { if (sep) print "" }' "$NOTES"
}

check_notes_stale() {
    [[ -f $NOTES ]] || return 0
    local subjects s
    subjects=$(for c in $(from_commits); do subject_of "$c"; done)
    while IFS= read -r s; do
        grep -qxF -- "$s" <<<"$subjects" ||
            die 5 "$NOTES has a note for '$s', which is no patch of the $FROM series; fix or delete it"
    done < <(sed -n 's/^== //p' "$NOTES")
}

# Pick the FROM commits from index $1 (0-based) on.
# A patch that changes one of upstream's own test files conflicts where VERSION's base has no tests/
# (an sdist without a pinned snapshot of upstream's tests): that change is left out and the pick goes
# on; the port is then "adapted" and its note says so. Any other conflict is left to resolve by hand.
leave_out_missing_upstream_tests() {
    local status paths
    status=$(g status --porcelain --untracked-files=no | grep -v '^[MADRC] ' || true)
    [[ -n $status ]] && ! grep -qv '^DU tests/' <<<"$status" || return 1
    paths=$(sed 's/^DU //' <<<"$status")
    xargs -d '\n' git -C "$TREE" rm -q -- <<<"$paths"
    g -c core.editor=true cherry-pick --continue >>"$STATE.log" 2>&1 || return 1
    info "  left out (no such file in $VERSION): $(paste -sd' ' - <<<"$paths")"
}

pick_from() {
    local i=$1 commits files
    mapfile -t commits < <(from_commits)
    for ((; i < ${#commits[@]}; i++)); do
        printf 'next=%d\n' "$i" >"$STATE.next"
        info "patch $((i + 1))/${#commits[@]}: $(subject_of "${commits[i]}")"
        if ! g cherry-pick --allow-empty --keep-redundant-commits "${commits[i]}" >"$STATE.log" 2>&1 &&
            ! leave_out_missing_upstream_tests; then
            sed 's/^/  git: /' "$STATE.log" >&2
            files=$(g diff --name-only --diff-filter=U | paste -sd' ' -)
            [[ -n $files ]] || die 1 "git cherry-pick failed without a conflict; see its output above"
            printf 'next=%d\n' "$((i + 1))" >"$STATE.next"
            cat >&2 <<EOF

$PROG: patch $((i + 1)) of ${#commits[@]} conflicts on $VERSION: $(subject_of "${commits[i]}")
  conflicting file(s), in $TREE: $files
  The $FROM patch:      git -C $TREE show ${commits[i]}
  $VERSION side: git -C $TREE diff   (conflict markers; ours = $VERSION with the $i patch(es) before it)
What to do:
  1. Port the change: the same behaviour, written for $VERSION's code (never keep a side
     blindly). Then: git -C $TREE add <files>
  2. Describe what you adapted in $NOTES, under the line
       == $(subject_of "${commits[i]}")
  3. scripts/$PROG $VERSION --continue      (or --abort to give up)
EOF
            exit 4
        fi
    done
    rm -f -- "$STATE.next" "$STATE.log"
}

# Rewrite each commit's message: FROM's message with the backport paragraph before its trailers.
finish() {
    local commits ported base n i parent newparent msg para note subject how pid tip cover summary=()
    mapfile -t commits < <(from_commits)
    base=$(state_get base)
    mapfile -t ported < <(g rev-list --reverse "$base..refs/heads/$BRANCH")
    n=${#commits[@]}
    ((${#ported[@]} == n)) ||
        die 5 "$BRANCH has ${#ported[@]} commit(s) on $VERSION, the $FROM series $n: keep one commit per $FROM patch, in order"
    check_notes_stale
    newparent=$base
    for ((i = 0; i < n; i++)); do
        subject=$(subject_of "${commits[i]}")
        [[ $(subject_of "${ported[i]}") == "$subject" ]] ||
            die 5 "commit $((i + 1)) on $BRANCH is '$(subject_of "${ported[i]}")', the $FROM patch '$subject': keep the order and subjects"
        parent=$(g rev-parse "${ported[i]}^")
        note=$(note_for "$subject")
        if [[ $(change_lines "${commits[i]}") == "$(change_lines "${ported[i]}")" ]]; then
            if applies_plainly "${commits[i]}" "$parent"; then
                how="unchanged: the $FROM patch applies as it is."
            else
                how="merged: the same added and removed lines as in $FROM; only their context differs in $VERSION (3-way merge)."
            fi
            # A note says what was adapted; a patch that now ports as it is has nothing adapted,
            # and an old note left for it would describe a port that no longer exists.
            [[ -z $note ]] || die 5 "$NOTES has a note for '$subject', but that patch now ports without adaptation ($how); delete the note, then run: scripts/$PROG $VERSION --finish"
        else
            [[ -n $note ]] || die 5 "patch $((i + 1)) ('$subject') differs from the $FROM patch in its added or removed lines; say what was adapted for $VERSION in $NOTES under '== $subject', then run: scripts/$PROG $VERSION --finish"
            how="adapted: $note"
        fi
        # The FROM patch's patch-id names the exact version of it that was ported: the check in
        # tests/test_backports.py compares it with patches/FROM/ to catch a series left behind.
        pid=$(g show "${commits[i]}" | git patch-id --stable | cut -c1-12)
        para="Backport to $VERSION of the $FROM patch (git patch-id $pid): $how"
        # FROM's message with the paragraph inserted before its trailer block (the last
        # paragraph, when every line of it is "Token: value").
        msg=$(g log -1 --format=%B "${commits[i]}" | awk -v para="$para" '
            { line[++n] = $0 }
            END {
                while (n > 0 && line[n] == "") n--
                s = n
                while (s > 0 && line[s] != "") s--
                trailer = s > 1
                for (k = s + 1; k <= n; k++) if (line[k] !~ /^[A-Za-z0-9-]+: /) trailer = 0
                body_end = trailer ? s - 1 : n
                for (k = 1; k <= body_end; k++) print line[k]
                print ""
                cmd = "fold -s -w 72 | sed \"s/ *$//\""
                print para | cmd
                close(cmd)
                if (trailer) { print ""; for (k = s + 1; k <= n; k++) print line[k] }
            }')
        # Keep the FROM patch's authorship; the tree is the ported one.
        newparent=$(
            export GIT_AUTHOR_NAME GIT_AUTHOR_EMAIL GIT_AUTHOR_DATE GIT_COMMITTER_NAME GIT_COMMITTER_EMAIL GIT_COMMITTER_DATE
            IFS=$'\n' read -r -d '' GIT_AUTHOR_NAME GIT_AUTHOR_EMAIL GIT_AUTHOR_DATE < <(g log -1 --format='%an%n%ae%n%ad%x00' --date=raw "${commits[i]}") || true
            GIT_COMMITTER_NAME=$GIT_AUTHOR_NAME GIT_COMMITTER_EMAIL=$GIT_AUTHOR_EMAIL GIT_COMMITTER_DATE=$GIT_AUTHOR_DATE
            printf '%s\n' "$msg" | g commit-tree "$(g rev-parse "${ported[i]}^{tree}")" -p "$newparent" -F -
        )
        info "  $((i + 1))/$n $subject: ${how%%:*}"
        summary+=("$(printf '%d. %s: %s\n' "$((i + 1))" "$subject" "$how" | fold -s -w 69 | sed -e 's/ *$//' -e '2,$s/^/   /')")
    done
    tip=$(g rev-parse "refs/heads/$BRANCH")
    g update-ref -m "$PROG: backport paragraphs" "refs/heads/$BRANCH" "$newparent" "$tip"
    g reset -q --hard "refs/heads/$BRANCH"
    [[ -f $OUT/cover-letter.txt ]] ||
        die 5 "no $OUT/cover-letter.txt: write the cover letter's subject (first line) and a short text on what the $VERSION backport is, then run: scripts/$PROG $VERSION --finish"
    # The cover letter: VERSION's own subject and text, the per-patch summary computed above,
    # then FROM's text, so that what the series does is written once, in patches/FROM/.
    cover=$(mktemp "${TMPDIR:-/tmp}/zero3-port-cover.XXXXXX")
    {
        cat -- "$OUT/cover-letter.txt"
        printf '\nEach patch, against the %s series:\n\n' "$FROM"
        printf '%s\n' "${summary[@]}"
        printf '\nThe cover letter of the %s series:\n\n' "$FROM"
        awk 'body {print} !body && /^[[:space:]]*$/ {body = 1}' "$REPO_ROOT/patches/$FROM/cover-letter.txt"
    } >"$cover"
    bash "$SCRIPT_DIR/export-patches.sh" --tree "$TREE" --out "$OUT" --cover-letter "$cover"
    rm -f -- "$cover"
    info "done: patches/$VERSION/ holds the $FROM series ported to $VERSION; check it with"
    info "  ZERO3_VERSION=$VERSION tox -e cpu-backport,pristine-backport"
}

case $MODE in
    abort)
        [[ -f $STATE ]] || die 6 "no port in progress in $TREE"
        g cherry-pick --abort 2>/dev/null || true
        rm -f -- "$STATE" "$STATE.next" "$STATE.log"
        info "port of $FROM to $VERSION aborted; $TREE is left as it is"
        exit 0
        ;;
    continue)
        [[ -f $STATE.next ]] || die 6 "no port stopped on a conflict in $TREE; start one with: scripts/$PROG $VERSION"
        [[ $(state_get from) == "$FROM" ]] || die 6 "the port in progress is from $(state_get from); pass --from $(state_get from)"
        if g rev-parse -q --verify CHERRY_PICK_HEAD >/dev/null; then
            [[ -z $(g diff --name-only --diff-filter=U) ]] ||
                die 4 "unresolved files in $TREE: $(g diff --name-only --diff-filter=U | paste -sd' ' -); resolve them and git add them first"
            GIT_EDITOR=true g cherry-pick --continue >/dev/null
        fi
        pick_from "$(sed -n 's/^next=//p' "$STATE.next")"
        finish
        ;;
    finish)
        [[ -f $STATE ]] || die 6 "no port in $TREE; start one with: scripts/$PROG $VERSION"
        [[ ! -f $STATE.next ]] || die 6 "a port is stopped on a conflict in $TREE: resolve it and run --continue"
        [[ $(state_get from) == "$FROM" ]] || die 6 "the port in $TREE is from $(state_get from); pass --from $(state_get from)"
        finish
        ;;
    start)
        [[ ! -f $STATE.next ]] || die 6 "a port is stopped on a conflict in $TREE: --continue or --abort it first"
        [[ -f $REPO_ROOT/patches/$FROM/series ]] || die 3 "no series in patches/$FROM"
        mkdir -p -- "$PORT_DIR"
        # Both trees are this script's scratch space: --force lets apply.sh re-create them when
        # the series changed (it only ever deletes a tree carrying its own marker). It keeps a tree
        # whose patches have the same diffs, but the ports take FROM's messages from its commits,
        # which may have changed alone: the FROM tree, when apply.sh made it, is made again.
        [[ ! -f $SRC/.git/zero3-apply ]] || rm -rf -- "$SRC"
        bash "$SCRIPT_DIR/apply.sh" "$FROM" --dest "$SRC" --branch "zero3/$FROM" --force >/dev/null ||
            die 3 "could not build $FROM with its series (apply.sh's message is above)"
        bash "$SCRIPT_DIR/apply.sh" "$VERSION" --pristine --dest "$TREE" --force >/dev/null ||
            die 3 "could not build pristine $VERSION (apply.sh's message is above)"
        src_base=$(git -C "$SRC" config --get "branch.zero3/$FROM.zero3base")
        base=$(g config --get "branch.$BRANCH.zero3base")
        g reset -q --hard "$base"
        g fetch -q --no-tags "$SRC" "+refs/heads/zero3/$FROM:$FROM_REF"
        printf 'from=%s\nfrom_base=%s\nbase=%s\n' "$FROM" "$src_base" "$base" >"$STATE"
        info "porting $(g rev-list --count "$src_base..$FROM_REF") patch(es) of $FROM onto $VERSION (base $base) in $TREE"
        check_notes_stale
        pick_from 0
        finish
        ;;
esac
