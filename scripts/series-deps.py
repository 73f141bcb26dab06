#!/usr/bin/env python3
"""Which patches of a series depend on which: the graph docs/guide/forks.md quotes.

    python scripts/series-deps.py VERSION            print the graph of patches/VERSION/
    python scripts/series-deps.py VERSION --write    write it to docs/guide/series-deps-VERSION.txt
    python scripts/series-deps.py VERSION --check    exit 1 when that file differs from the series now
    python scripts/series-deps.py OLD --upgrade NEW [--write | --check]
                                                   what a fork carrying OLD's series drops and takes when it
                                                   moves to NEW (docs/guide/series-upgrade-OLD-NEW.txt)

It builds the patched tree with scripts/apply.sh (in a scratch directory) and reads two kinds of edge
from its commits, one commit per patch:

- text: a hunk of patch k has a context or removed line that patch j wrote (git blame of k's parent),
  so k does not apply (git am, no 3-way) without j;
- uses: patch k's added lines name a function, method, attribute or class that patch j defines and the
  release does not have, so k may apply without j but cannot work without it.

For each patch it also records whether it applies alone to the release (git apply --check on the base)
and checks the graph: the patch applies to the base with the text edges' closure before it. A patch
with no edge still shares the series' test expectations; "no edge" means the two can be taken apart,
not that they were tested apart (tox -e bisect tests prefixes).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFINES = [
    re.compile(r"^\s*def (\w+)\("),
    re.compile(r"^\s*class (\w+)\b"),
    re.compile(r"^\s*self\.(\w+)\s*(?::[^=]*)?=[^=]"),
    re.compile(r"^(\w+)\s*(?::[^=]*)?=[^=]"),
]
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def git(repo, *args, env=None, check=True):
    run = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if check and run.returncode:
        sys.exit(f"series-deps.py: git {' '.join(args)} failed: {run.stderr.strip()}")
    return run


def build(version, dest):
    run = subprocess.run(["bash", str(ROOT / "scripts" / "apply.sh"), version, "--dest", str(dest)],
                         capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"series-deps.py: scripts/apply.sh {version} failed:\n{run.stderr}")
    branch = f"zero3/{version}"
    base = git(dest, "config", "--get", f"branch.{branch}.zero3base").stdout.strip()
    commits = git(dest, "rev-list", "--reverse", f"{base}..{branch}").stdout.split()
    return base, commits


def added_lines(repo, commit):
    diff = git(repo, "show", "--format=", "--unified=0", commit).stdout
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def text_deps(repo, commit, index_of):
    """{patch index: [files]} of series commits that wrote a context or removed line of COMMIT's hunks."""
    deps = {}
    diff = git(repo, "show", "--format=", "--unified=3", commit).stdout
    path, blame = None, None
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else None
            blame = None
            continue
        m = HUNK.match(line)
        if not (m and path):
            continue
        if blame is None:
            out = git(repo, "blame", "--porcelain", f"{commit}^", "--", path).stdout
            blame = {}
            for b in re.finditer(r"^([0-9a-f]{40}) \d+ (\d+)", out, re.M):
                blame[int(b.group(2))] = b.group(1)
        start, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
        for n in range(start, start + count):
            j = index_of.get(blame.get(n))
            if j is not None:
                deps.setdefault(j, set()).add(path)
    return deps


def defined_names(lines, base_words):
    """Names LINES define (def, class, attribute or module assignment) that the release has nowhere."""
    names = set()
    for line in lines:
        for pattern in DEFINES:
            m = pattern.match(line)
            if m and len(m.group(1)) > 3 and m.group(1) not in base_words:
                names.add(m.group(1))
    return names


PATCHES = {}  # commit -> its diff, made once


def applies(repo, base, commits, env_dir):
    """Do COMMITS' diffs, in order, apply to BASE with git apply (no 3-way, as git am)?"""
    env = dict(os.environ, GIT_INDEX_FILE=str(env_dir / "index"))
    git(repo, "read-tree", base, env=env)
    for c in commits:
        if c not in PATCHES:
            PATCHES[c] = git(repo, "show", "--format=", "--binary", c).stdout
        patch = PATCHES[c]
        run = subprocess.run(["git", "-C", str(repo), "apply", "--cached"], input=patch, text=True, env=env,
                             capture_output=True)
        if run.returncode:
            return False
    return True


def graph(version):
    with tempfile.TemporaryDirectory(prefix="series-deps-") as tmp:
        tmp = Path(tmp)
        tree = tmp / "tree"
        base, commits = build(version, tree)
        index_of = {c: i for i, c in enumerate(commits)}
        names = [f"{i + 1:04d}" for i in range(len(commits))]
        subjects = [git(tree, "log", "-1", "--format=%s", c).stdout.strip() for c in commits]
        base_words = set(re.findall(r"\w+", git(tree, "grep", "-h", "-I", "-e", ".", base, "--", "deepspeed").stdout))
        defined = {}  # name -> index of the first patch defining it
        rows = []  # (text deps, uses, applies alone) per patch
        for k, c in enumerate(commits):
            added = added_lines(tree, c)
            own = defined_names(added, base_words)
            body = "\n".join(line for line in added if not any(p.match(line) for p in DEFINES))
            uses = {}
            for name, j in defined.items():
                if name not in own and re.search(rf"\b{re.escape(name)}\b", body):
                    uses.setdefault(j, set()).add(name)
            for name in own:
                defined.setdefault(name, k)
            rows.append((text_deps(tree, c, index_of), uses, applies(tree, base, [c], tmp)))
        out = [f"# Dependencies between the patches of patches/{version}/ (scripts/series-deps.py {version} --write;",
               "# CI checks that this file matches the series). \"text\": the patch changes, or needs as context,",
               "# lines that patch wrote (it does not apply without it); \"uses\": it names what that patch defines.",
               "# \"alone\": whether the patch applies to the release by itself (git am, no 3-way).", ""]
        for k, (text, uses, alone) in enumerate(rows):
            closure = text_closure(k, rows)
            if not applies(tree, base, [commits[j] for j in sorted(closure)] + [commits[k]], tmp):
                sys.exit(f"series-deps.py: {names[k]} does not apply after its text dependencies "
                         f"{', '.join(names[j] for j in sorted(closure))}: the graph is incomplete")
            parts = [f"text {', '.join(names[j] for j in sorted(text))}"] if text else []
            parts += [f"uses {names[j]} ({', '.join(sorted(uses[j]))})" for j in sorted(uses)]
            out.append(f"{names[k]} {subjects[k]}")
            out.append(f"     alone: {'applies' if alone else 'does not apply'}; "
                       f"{'; '.join(parts) if parts else 'depends on no other patch'}")
        return "\n".join(out) + "\n"


def patch_subjects(version):
    """The subjects of patches/VERSION/series, unfolded, without [PATCH n/m]."""
    subjects = []
    for name in (ROOT / "patches" / version / "series").read_text().split():
        m = re.search(r"^Subject: \[PATCH[^\]]*\] (.*(?:\n .*)*)", (ROOT / "patches" / version / name).read_text(), re.M)
        subjects.append(" ".join(m.group(1).split()))
    return subjects


def upgrade(old, new):
    """Each patch of OLD's series and the patch of NEW's with the same subject, if any; then NEW's others."""
    before, after = patch_subjects(old), patch_subjects(new)
    out = [f"# A fork carrying patches/{old}/ that moves to {new} drops every one of them (scripts/drop-series.sh) and",
           f"# takes patches/{new}/ (scripts/apply.sh {new} --onto BRANCH). Generated by scripts/series-deps.py {old}",
           f"# --upgrade {new} --write from the patches' subjects; CI checks it matches them.", "",
           f"{old:<8} {new:<8} subject", ""]
    for i, subject in enumerate(before):
        j = after.index(subject) + 1 if subject in after else None
        out.append(f"{i + 1:04d}     {f'{j:04d}' if j else '-':<8} {subject}")
    out.append("")
    out.append(f"{new} patches with no {old} patch of the same subject:")
    out += [f"-        {j + 1:04d}     {subject}" for j, subject in enumerate(after) if subject not in before]
    return "\n".join(out) + "\n"


def text_closure(k, rows):
    """The patches K needs by text, directly or through another."""
    seen, todo = set(), list(rows[k][0])
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(rows[j][0])
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version")
    parser.add_argument("--upgrade", metavar="NEW", help="the upgrade table from VERSION's series to NEW's")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true")
    what.add_argument("--check", action="store_true")
    args = parser.parse_args()
    for version in filter(None, (args.version, args.upgrade)):
        if not (ROOT / "patches" / version / "series").is_file():
            sys.exit(f"series-deps.py: no series patches/{version}/series")
    if args.upgrade:
        text = upgrade(args.version, args.upgrade)
        target = ROOT / "docs" / "guide" / f"series-upgrade-{args.version}-{args.upgrade}.txt"
        regenerate = f"python scripts/series-deps.py {args.version} --upgrade {args.upgrade} --write"
    else:
        text = graph(args.version)
        target = ROOT / "docs" / "guide" / f"series-deps-{args.version}.txt"
        regenerate = f"python scripts/series-deps.py {args.version} --write"
    if args.write:
        target.write_text(text)
        print(f"series-deps.py: wrote {target.relative_to(ROOT)}")
    elif args.check:
        if not target.is_file() or target.read_text() != text:
            sys.exit(f"series-deps.py: {target.relative_to(ROOT)} does not match patches/ now; regenerate it: {regenerate}")
        print(f"series-deps.py: {target.relative_to(ROOT)} matches patches/")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
