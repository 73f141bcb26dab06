#!/usr/bin/env bash
# Sequence editor for `git rebase -i`: drop the commits of a series of this repository (patches/VERSION/,
# recognised by subject), keep every other commit as it is. For moving a fork to a newer release
# (docs/guide/forks.md, "Upgrade"): the fork's own commits go onto the new release, the old series stays
# behind, and `scripts/apply.sh NEW --onto BRANCH` then brings the new release's series.
#
#   GIT_SEQUENCE_EDITOR="/path/to/this/repo/scripts/drop-series.sh v0.19.2" git rebase -i --onto v0.19.8 v0.19.2
#
# git passes the todo file as the last argument. The script prints how many commits it dropped and kept.
set -euo pipefail

PROG=drop-series.sh
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
(($# == 2)) || { printf '%s: usage: GIT_SEQUENCE_EDITOR="%s VERSION" git rebase -i ...\n' "$PROG" "$0" >&2; exit 2; }
VERSION=$1 TODO=$2
SERIES=$ROOT/patches/$VERSION/series
[[ -f $SERIES ]] || { printf '%s: no series %s\n' "$PROG" "$SERIES" >&2; exit 2; }
[[ -f $TODO ]] || { printf '%s: no rebase todo file %s\n' "$PROG" "$TODO" >&2; exit 2; }

subjects=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$SERIES" | while read -r patch; do
    # the Subject header, unfolded, without its [PATCH n/m]
    awk '/^Subject: /{s=$0; sub(/^Subject: \[PATCH[^]]*\] /, "", s); while ((getline l) > 0 && l ~ /^ /) s = s l; print s; exit}' \
        "$ROOT/patches/$VERSION/$patch"
done)
# todo lines: "pick <id> <subject>"; only picks are touched
awk -v subjects="$subjects" -v prog="$PROG" -v version="$VERSION" '
    BEGIN { n = split(subjects, list, "\n"); for (i = 1; i <= n; i++) drop[list[i]] = 1 }
    $1 == "pick" || $1 == "p" {
        subject = $0
        sub(/^[^ ]+ [^ ]+ /, "", subject)
        if (subject in drop) { sub(/^[^ ]+/, "drop"); dropped++ } else kept++
    }
    { print }
    END { printf "%s: dropped %d commit(s) of the %s series, kept %d\n", prog, dropped, version, kept > "/dev/stderr" }
' "$TODO" >"$TODO.zero3" && mv -- "$TODO.zero3" "$TODO"
