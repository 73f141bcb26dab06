"""Backport series (patches/VERSION/ written by scripts/port-series.sh) and their checks.

    python scripts/backport_env.py list     the backport bases, in pinned-bases order
    python scripts/backport_env.py verify   each backport corresponds patch by patch to its source
    python scripts/backport_env.py check    (tox) ZERO3_VERSION names a backport base
    python scripts/backport_env.py import   (tox, after pip install) that release imports

A backport base is a release in scripts/pinned-bases.tsv whose patches carry the paragraph
"Backport to VERSION of the FROM patch (git patch-id ...): unchanged|merged|adapted: ...".
verify (also run by tests/test_backports.py) checks against patches/FROM/: the same number of
patches, the same subjects, the same test files (an adapted port may leave out a change to one of
upstream's own test files, which an sdist base lacks), each ported from the FROM patch as it is now
(its patch-id), and "unchanged"/"merged" patches adding and removing exactly FROM's lines.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def backport_bases():
    """The pinned releases whose series says it is a backport, in pinned-bases order."""
    bases = []
    for line in (ROOT / "scripts" / "pinned-bases.tsv").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        version = line.split("\t", 1)[0]
        series = ROOT / "patches" / version / "series"
        if series.is_file():
            first = series.read_text().split()[0]
            if f"Backport to {version} " in (series.parent / first).read_text():
                bases.append(version)
    return bases


BACKPORT = re.compile(r"Backport to (?P<version>v[0-9.]+) of the (?P<source>v[0-9.]+) patch "
                      r"\(git patch-id (?P<pid>[0-9a-f]{12})\): (?P<how>unchanged|merged|adapted):")


def read_series(version):
    """[(file name, text)] of patches/VERSION/, in series order."""
    directory = ROOT / "patches" / version
    return [(name, (directory / name).read_text()) for name in (directory / "series").read_text().split()]


def subject(text):
    """The Subject header, continuation lines joined, without its [PATCH n/m] prefix."""
    match = re.search(r"^Subject: (.*(?:\n .*)*)", text, re.M)
    return re.sub(r"^\[PATCH[^]]*\] ", "", match.group(1).replace("\n ", " ")) if match else None


def touched(text):
    """Paths the patch changes (after renames), in order."""
    return [m.group(1) for m in re.finditer(r"^diff --git a/\S+ b/(\S+)$", text, re.M)]


def added(text):
    """Paths the patch creates."""
    return [m.group(1) for m in re.finditer(r"^diff --git a/\S+ b/(\S+)\nnew file mode", text, re.M)]


def change_lines(text):
    """Added and removed lines, per file, without context: what port-series.sh calls the change."""
    lines = []
    in_diff = False
    for line in text.splitlines():
        if line.startswith("diff --git "):
            in_diff = True
            lines.append(line)
        elif in_diff and line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- ")):
            lines.append(line)
        elif line == "-- ":  # the signature separator ends the diff
            in_diff = False
    return lines


def patch_id(text):
    out = subprocess.run(["git", "patch-id", "--stable"], input=text, capture_output=True, text=True, check=True)
    return out.stdout.split()[0][:12] if out.stdout else None


def correspondence_problems(version):
    """What makes patches/VERSION/ not a faithful port of its source series (empty: nothing)."""
    ported = read_series(version)
    claims = []
    for name, text in ported:
        message = text.split("\n---\n", 1)[0].replace("\n", " ")
        match = BACKPORT.search(message)
        claims.append(match)
    if not all(claims):
        return [f"{version}: {name} has no 'Backport to {version} of the ... patch' paragraph"
                for (name, _), claim in zip(ported, claims) if not claim]
    sources = {claim["source"] for claim in claims}
    if len(sources) != 1 or any(claim["version"] != version for claim in claims):
        return [f"{version}: the patches name different releases ({', '.join(sorted(sources))})"]
    source = sources.pop()
    original = read_series(source)
    problems = []
    if len(original) != len(ported):
        problems.append(f"{version}: {len(ported)} patches, the {source} series has {len(original)}")
    for i, ((name, text), (src_name, src_text), claim) in enumerate(zip(ported, original, claims), 1):
        where = f"{version} patch {i} ({name})"
        if subject(text) != subject(src_text):
            problems.append(f"{where}: subject '{subject(text)}', the {source} patch's is '{subject(src_text)}'")
        tests = [p for p in touched(text) if p.startswith("tests/")]
        src_tests = [p for p in touched(src_text) if p.startswith("tests/")]
        # A port carries every test file the source patch adds; a change to one of upstream's own
        # test files may be left out ("adapted") where the base's sdist has no tests/.
        kept = [p for p in src_tests if p in tests or p in added(src_text) or claim["how"] != "adapted"]
        if tests != kept:
            problems.append(f"{where}: test files {tests}, the {source} patch's are {src_tests}")
        if claim["pid"] != patch_id(src_text):
            problems.append(f"{where}: ported from another version of {source}'s {src_name} "
                            f"(patch-id {claim['pid']}, now {patch_id(src_text)})")
        elif claim["how"] != "adapted" and change_lines(text) != change_lines(src_text):
            problems.append(f"{where}: says '{claim['how']}' but adds or removes other lines than {src_name}")
    if problems:
        problems.append(f"carry the {source} series over again: scripts/port-series.sh {version} --from {source}")
    return problems


def main(argv):
    if len(argv) != 1 or argv[0] not in ("check", "import", "list", "verify"):
        sys.exit(__doc__)
    bases = backport_bases()
    if argv[0] == "list":
        print(" ".join(bases))
        return
    if argv[0] == "verify":
        problems = [p for base in bases for p in correspondence_problems(base)]
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            sys.exit(1)
        print(f"backport_env.py: {', '.join(bases)} correspond patch by patch to their source series")
        return
    version = os.environ.get("ZERO3_VERSION", "")
    if version not in bases:
        sys.exit(f"backport_env.py: ZERO3_VERSION={version!r} is not a backport base; set it to one of "
                 f"{', '.join(bases)}, e.g. ZERO3_VERSION={bases[0]} tox -e cpu-backport")
    if argv[0] == "import":
        import deepspeed
        installed = deepspeed.__version__.strip()
        # a build from a git tree may append "+<commit>" to the release number
        if installed.split("+")[0] != version[1:]:
            sys.exit(f"backport_env.py: DeepSpeed {installed} is installed ({deepspeed.__file__}), not {version}")
        print(f"backport_env.py: DeepSpeed {installed} imports from {deepspeed.__file__}")


if __name__ == "__main__":
    main(sys.argv[1:])
