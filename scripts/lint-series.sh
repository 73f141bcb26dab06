#!/usr/bin/env bash
# Run DeepSpeed's pre-commit checks (as of v0.19.2) on the files the patch series touches, plus
# the commit-message rules upstream asks for. Used by `tox -e lint`; see --help.
set -Eeuo pipefail

PROG=lint-series.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/lint-series.sh [--tree DIR] [--branch NAME] [--base REV]

Checks the committed content of every file that base..branch adds or modifies in the patched
checkout DIR (default: build/deepspeed-VERSION for the first pinned version), with upstream's
pinned tools and settings:
  yapf 0.40.0 (COLUMN_LIMIT 119), flake8 5.0.4 (upstream selection), codespell 2.1.0,
  check-license, check-torchdist, check-torchcuda, and the pre-commit-hooks file checks
  (trailing whitespace, final newline, LF line endings, no BOM, no coding pragma, valid YAML/JSON).
Each commit must have a subject of at most 72 characters and no Signed-off-by trailer: the
committed patches name no person; scripts/prepare-submission.sh adds the submitter's sign-off.
yapf, flake8 and codespell must be on PATH (tox -e lint installs the pinned versions).
Exit status: 0 clean, 1 findings, 2 usage or setup problem.
EOF
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}

TREE='' BRANCH='' BASE=''
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --tree | --branch | --base)
            if (($# < 2)) || [[ -z $2 ]]; then die "option $1 needs a value"; fi
            case $1 in
                --tree) TREE=$2 ;;
                --branch) BRANCH=$2 ;;
                --base) BASE=$2 ;;
            esac
            shift
            ;;
        *) die "unexpected argument '$1' (see --help)" ;;
    esac
    shift
done

if [[ -z $TREE ]]; then
    first=$(awk -F'\t' '$1 !~ /^#/ && NF >= 4 {print $1; exit}' "$SCRIPT_DIR/pinned-bases.tsv")
    TREE=$REPO_ROOT/build/deepspeed-$first
fi
TREE=$(git -C "$TREE" rev-parse --show-toplevel 2>/dev/null) || die "--tree $TREE is not a git checkout (run scripts/apply.sh first)"
if [[ -z $BRANCH ]]; then
    BRANCH=$(git -C "$TREE" symbolic-ref -q --short HEAD) || die "$TREE has a detached HEAD; pass --branch"
fi
if [[ -z $BASE ]]; then
    BASE=$(git -C "$TREE" config --get "branch.$BRANCH.zero3base") ||
        die "branch $BRANCH has no base recorded by apply.sh; pass --base REV"
fi
for tool in yapf flake8 codespell python3; do
    command -v "$tool" >/dev/null || die "$tool not found on PATH (use tox -e lint)"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/zero3-lint.XXXXXX")
trap 'rm -rf -- "$TMP"' EXIT

mapfile -t FILES < <(git -C "$TREE" diff --name-only --diff-filter=ACMR "$BASE" "refs/heads/$BRANCH" --)
((${#FILES[@]})) || die "the series touches no files ($BASE..$BRANCH)"
# Lint what is committed, not the working tree: an in-place pip install rewrites files there.
mkdir "$TMP/src"
git -C "$TREE" archive --format=tar "refs/heads/$BRANCH" -- "${FILES[@]}" | tar -x -C "$TMP/src"
# Upstream's configuration files; the sdist does not ship them, so they are written here.
printf '[style]\nSPLIT_ALL_COMMA_SEPARATED_VALUES = false\nCOLUMN_LIMIT = 119\n' >"$TMP/src/.style.yapf"
printf '[flake8]\nignore = E,F403,F405,F541,F841,W\nselect = E9,F,W6\nper-file-ignores =\n    __init__.py:F401\n' \
    >"$TMP/src/.flake8"

PY=()
for f in "${FILES[@]}"; do [[ $f == *.py ]] && PY+=("$f"); done

failed=0
section() { printf '\n== %s\n' "$1"; }
fail() {
    failed=1
    printf 'FAIL: %s\n' "$1"
}

cd -- "$TMP/src"
printf 'Linting %d file(s) touched by %s..%s in %s\n' "${#FILES[@]}" "$BASE" "$BRANCH" "$TREE"
printf '  %s\n' "${FILES[@]}"

section "commits: no Signed-off-by, subject length"
while IFS= read -r c; do
    subject=$(git -C "$TREE" log -1 --format=%s "$c")
    if git -C "$TREE" log -1 --format=%B "$c" | grep -q '^Signed-off-by:'; then
        fail "commit ${c:0:12} \"$subject\" has a Signed-off-by trailer: only the submitter signs off, when a batch is prepared (scripts/prepare-submission.sh)"
    fi
    if ((${#subject} > 72)); then
        fail "commit ${c:0:12} subject is ${#subject} characters (at most 72): $subject"
    fi
done < <(git -C "$TREE" rev-list --reverse "$BASE..refs/heads/$BRANCH")

if ((${#PY[@]})); then
    section "yapf 0.40.0"
    if ! out=$(yapf --style .style.yapf --diff -- "${PY[@]}" 2>&1) || [[ -n $out ]]; then
        printf '%s\n' "$out"
        fail "yapf would reformat the files above"
    fi
    section "flake8 5.0.4"
    flake8 --config .flake8 -- "${PY[@]}" || fail "flake8"
fi

section "codespell 2.1.0"
codespell --check-filenames --check-hidden --ignore-words-list=youn,unsupport,noe,cann -- "${FILES[@]}" ||
    fail "codespell"

section "license, torchdist, torchcuda, file hygiene"
python3 - "${FILES[@]}" <<'EOF' || fail "the checks above"
import json, re, sys

bad = 0


def report(path, lineno, msg):
    global bad
    bad = 1
    print(f"{path}:{lineno}: {msg}")


for path in sys.argv[1:]:
    data = open(path, "rb").read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        continue  # binary file: the text checks do not apply
    if data.startswith(b"\xef\xbb\xbf"):
        report(path, 1, "byte-order mark (fix-byte-order-marker)")
    if b"\r" in data:
        report(path, 1, "CR line endings (mixed-line-ending --fix=lf)")
    if data and not data.endswith(b"\n"):
        report(path, len(text.splitlines()), "no newline at end of file (end-of-file-fixer)")
    if data.endswith(b"\n\n"):
        report(path, len(text.splitlines()), "blank lines at end of file (end-of-file-fixer)")
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line != line.rstrip():
            report(path, n, "trailing whitespace (trailing-whitespace)")
    if path.endswith(".py"):
        if not any("SPDX-License-Identifier: Apache-2.0" in l for l in lines):
            report(path, 1, "missing 'SPDX-License-Identifier: Apache-2.0' (check-license)")
        if not any("DeepSpeed Team" in l for l in lines):
            report(path, 1, "missing 'DeepSpeed Team' (check-license)")
        for n, line in enumerate(lines[:2], 1):
            if re.match(r"^#.*coding[:=]", line):
                report(path, n, "encoding pragma (fix-encoding-pragma --remove)")
        for n, line in enumerate(lines, 1):
            if re.search(r"torch\.cuda|\.cuda\(", line) and "#ignore-cuda" not in line:
                report(path, n, "torch.cuda / .cuda() (check-torchcuda): use get_accelerator(), or mark #ignore-cuda")
    if not path.startswith("deepspeed/comm/"):
        for n, line in enumerate(lines, 1):
            if "torch.distributed" in line:
                report(path, n, "torch.distributed outside deepspeed/comm/ (check-torchdist): use deepspeed.comm")
    if path.endswith(".json"):
        try:
            json.loads(text)
        except ValueError as exc:
            report(path, 1, f"invalid JSON (check-json): {exc}")
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            continue
        try:
            list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            report(path, 1, f"invalid YAML (check-yaml): {exc}")
sys.exit(bad)
EOF

echo
if ((failed)); then
    echo "lint-series: FAILED"
    exit 1
fi
echo "lint-series: all checks passed"
