#!/usr/bin/env python3
"""Which units of the v0.19.8 follow-up apply and pass on the releases between upstream's fix and v0.19.8.

    python scripts/followup_releases.py [--tests all|oldest|none] [--check] [--release V ...]
    python scripts/followup_releases.py --prepare-port RELEASE UNIT
    python scripts/followup_releases.py --export-port RELEASE UNIT
    python scripts/followup_releases.py --markdown
    python scripts/followup_releases.py --series-for RELEASE DIR

DeepSpeed v0.19.3 to v0.19.7 have upstream's fix #8148 (its partitioned_param_coordinator.py and
stage3.py code) and none of the follow-up: forks on them are its users too. For each of those releases
(pinned in scripts/pinned-bases.tsv, with upstream's tests/ from the snapshot v0.19.8 uses), this builds
the sha256-checked base with scripts/apply.sh, then applies the follow-up's units (patches/v0.19.8/batches)
in merge order with `git am` (no 3-way merge), each on top of the units before it. A unit that does not
apply as it is takes its port for that release, patches/v0.19.8/ports/RELEASE/UNIT/: a series exported
from commits on the same tree (--prepare-port builds it, --export-port writes the series and ported-from,
the unit's patch ids it was made from), whose cover-letter.txt says what differs from the unit and why; a
port of another version of the unit is stale. On the patched tree the unit's own tests run, found as
scripts/prove_batches.py finds a batch's (the tests the unit adds to or changes in the files it touches),
at world size 1 and 2.

It writes docs/_generated/followup-releases.json and followup-releases.md (stamped, see docs/_ext/stamps.py;
--markdown writes the .md again from the .json).
--tests oldest runs the tests on the oldest release only, --tests none on none (the apply columns only).
--series-for writes DIR as a patch directory for scripts/apply.sh (a `series` file and copies of the
patches): the units in merge order, each as it is or by its port, as the committed table records them on
RELEASE. apply.sh uses it for those releases, which have no patches/RELEASE/ of their own (build,
--onto a fork's branch). --check writes nothing: it fails when what it finds differs from the committed JSON (a unit's or port's
patches changed, a port is stale, a unit applies differently, a patched tree's commit differs) or a test
that ran fails;
CI runs `--check --tests none`: on the CPU these releases' coalesced parameter all-gather waits on its last
handle only (v0.19.8 waits on every one), so on gloo a test at world size 2 can read a parameter before its
gather finished, and a test run in CI would fail now and then for that, not for the follow-up (seen: one
`--tests oldest` run on v0.19.3 failed test_experts_routed_by_rank with wrong gradients, which passed in the
full runs). Trees go to build/followup-releases/. Exit 0 when every release has every
unit applied (as it is or ported) and every test that ran passes, 1 otherwise, 2 on bad usage.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prove_batches  # noqa: E402  (the batch, own-test and test-run code this shares)
from prove_batches import PASSED, REPO, am, batches_of, own_tests, series_test_files, sh  # noqa: E402

sys.path.insert(0, str(REPO / "docs" / "_ext"))
import stamps  # noqa: E402

FOLLOWUP = REPO / "patches" / "v0.19.8"
PORTS = FOLLOWUP / "ports"
RELEASES = ["v0.19.3", "v0.19.4", "v0.19.5", "v0.19.6", "v0.19.7"]
OUT_JSON = REPO / "docs" / "_generated" / "followup-releases.json"
OUT_MD = OUT_JSON.with_suffix(".md")
WORK = REPO / "build" / "followup-releases"
SCHEMA = "zero3-followup-releases/1"
COMMAND = "python scripts/followup_releases.py (with the torch of tox -e cpu-v0198; CI: --check --tests none)"
# How a unit got onto a release. "needs port": it does not apply and patches/v0.19.8/ports has no port for
# that release; "not tried": an earlier unit did not get on, so this one has no tree to go on.
APPLIES, PORTED, NEEDS_PORT, PORT_FAILS, NOT_TRIED = "applies", "port applied", "needs port", "port does not apply", \
    "not tried"


def pinned(release):
    """(sdist name, sha256, tests snapshot name) of RELEASE in scripts/pinned-bases.tsv."""
    for line in (REPO / "scripts" / "pinned-bases.tsv").read_text().splitlines():
        fields = line.split("\t")
        if fields[0] == release and len(fields) >= 6:
            return fields[2], fields[3], fields[4]
    sys.exit(f"followup_releases.py: {release} is not pinned with an upstream tests snapshot in "
             "scripts/pinned-bases.tsv")


def patch_ids(directory, names):
    """[{"file", "patch_id"}] of the patches NAMES in DIRECTORY: git's stable patch id, the diff alone."""
    return [{"file": name, "patch_id": stamps.patch_text_id((directory / name).read_text())} for name in names]


def port_dir(release, unit):
    return PORTS / release / unit


def port_patches(release, unit):
    """The patch files of the port of UNIT to RELEASE, in order; [] when there is none."""
    series = port_dir(release, unit) / "series"
    return [line.strip() for line in series.read_text().splitlines() if line.strip()] if series.is_file() else []


def ported_from(directory):
    """[{"file", "patch_id"}] of the unit's patches a port was made from (its ported-from, written by --export-port)."""
    path = directory / "ported-from"
    if not path.is_file():
        return None
    return [dict(zip(("file", "patch_id"), line.split())) for line in path.read_text().splitlines() if line.strip()]


def build_base(release):
    """The pristine RELEASE tree (apply.sh: the sha256-checked sdist plus upstream's tests/), and its commit."""
    base = WORK / f"{release}-base"
    apply = ["bash", REPO / "scripts" / "apply.sh", release, "--pristine", "--dest", base]
    # exit 5: a tree an earlier run made with another patch set, this script's own to replace
    if sh(*apply, check=False).returncode == 5:
        sh(*apply, "--force")
    return base, sh("git", "-C", base, "rev-parse", "HEAD").stdout.strip()


def fresh_clone(base, tree):
    if tree.exists():
        shutil.rmtree(tree)
    sh("git", "clone", "--quiet", "--shared", base, tree)


def apply_unit(tree, release, unit, patches):
    """Puts UNIT on TREE: its patches as they are, else its port to RELEASE. Returns the apply status."""
    before = sh("git", "-C", tree, "rev-parse", "HEAD").stdout.strip()
    if all(am(tree, FOLLOWUP / patch) for patch in patches):
        return APPLIES
    sh("git", "-C", tree, "reset", "--quiet", "--hard", before)
    port = port_patches(release, unit)
    if not port:
        return NEEDS_PORT
    if all(am(tree, port_dir(release, unit) / patch) for patch in port):
        return PORTED
    sh("git", "-C", tree, "reset", "--quiet", "--hard", before)
    return PORT_FAILS


def run_own_tests(tree, before, junit):
    """{test id: outcome} of the tests that the commits before..HEAD of TREE add to or change in the test
    files they touch, run on TREE."""
    files = series_test_files(tree, before)
    texts = {}
    for f in files:
        shown = sh("git", "-C", tree, "show", f"{before}:{f.as_posix()}", check=False)
        texts[f] = shown.stdout if shown.returncode == 0 else None
    own = own_tests(files, tree, texts)
    if not own:
        return {}
    return prove_batches.run_tests(tree, files, tree, junit, only=own)


def survey(release, units, run_tests):
    """The record of RELEASE: how each unit got on and, when RUN_TESTS, how its own tests went."""
    sdist, sha256, snapshot = pinned(release)
    base, base_commit = build_base(release)
    tree = WORK / release
    fresh_clone(base, tree)
    record = {"release": release, "sdist": sdist, "sha256": sha256, "tests_snapshot": snapshot,
              "base_commit": base_commit, "fix_8148": has_fix_8148(tree), "units": []}
    blocked = False
    for unit, patches in units.items():
        entry = {"unit": unit, "apply": NOT_TRIED, "port": None, "commit": None, "tests": None}
        record["units"].append(entry)
        if blocked:
            continue
        before = sh("git", "-C", tree, "rev-parse", "HEAD").stdout.strip()
        entry["apply"] = apply_unit(tree, release, unit, patches)
        if entry["apply"] in (PORTED, PORT_FAILS):
            entry["port"] = port_dir(release, unit).relative_to(REPO).as_posix()
            entry["port_patches"] = patch_ids(port_dir(release, unit), port_patches(release, unit))
        if entry["apply"] not in (APPLIES, PORTED):
            blocked = True
            print(f"{release} {unit}: {entry['apply']}", flush=True)
            continue
        entry["commit"] = sh("git", "-C", tree, "rev-parse", "HEAD").stdout.strip()
        if run_tests:
            outcomes = run_own_tests(tree, before, WORK / f"{release}-{unit}.xml")
            entry["tests"] = {"run": len(outcomes), "passed": sum(o == PASSED for o in outcomes.values()),
                              "not_passing": sorted(t for t, o in outcomes.items() if o != PASSED)}
        tests = entry["tests"]
        print(f"{release} {unit}: {entry['apply']}" +
              (f", its {tests['run']} tests: {tests['passed']} pass" if tests else ""), flush=True)
    return record


def has_fix_8148(tree):
    """Whether TREE holds upstream's fix #8148: the coordinator's record of the submodules whose backward is
    running and its recompute-parameter update, and stage3's release of what a backward leaves gathered."""
    coordinator = (tree / "deepspeed/runtime/zero/partitioned_param_coordinator.py").read_text()
    stage3 = (tree / "deepspeed/runtime/zero/stage3.py").read_text()
    return ("__active_backward_submodules" in coordinator and "def update_recompute_parameters" in coordinator
            and "release_backward_leftovers" in stage3)


# --------------------------------------------------------------------------- the table


def cell(entry):
    text = {APPLIES: "applies", PORTED: "port", NEEDS_PORT: "**needs port**", PORT_FAILS: "**port does not apply**",
            NOT_TRIED: "not tried"}[entry["apply"]]
    tests = entry["tests"]
    if tests:
        text += f"; {tests['passed']}/{tests['run']} pass" if tests["run"] else "; no tests of its own"
    return text


def render(data):
    """The markdown fragment (no top-level heading, as docs/_generated/README.md wants) of DATA, without its stamp."""
    snapshots = sorted({r["tests_snapshot"] for r in data["releases"]})
    lines = [
        "The v0.19.8 follow-up's units on the releases between upstream's fix #8148 and v0.19.8. "
        f"Generated {data['generated']} by `{data['stamp']['command']}`: {data['environment']}. "
        f"Each release is its PyPI sdist (sha256-checked) with upstream's tests/ from {', '.join(snapshots)}; "
        "the units go on in merge order, each on the ones before it, with `git am` (no 3-way merge), and a unit "
        "that does not apply as it is by its port (listed below). \"n/m pass\": the unit's own tests on the "
        "patched tree (world size 1 and 2); no figure: not run. These releases' coalesced parameter all-gather "
        "waits on its last handle only (v0.19.8 on every one), so on gloo a test at world size 2 can read a "
        "parameter before its gather finished: the counts are of one full run, and CI checks the apply columns.",
        "",
        "| release | #8148 | " + " | ".join(f"{u['unit']} ({len(u['patches'])})" for u in data["units"]) + " |",
        "|---|---|" + "---|" * len(data["units"]),
    ]
    for release in data["releases"]:
        lines.append(f"| {release['release']} | {'yes' if release['fix_8148'] else '**no**'} | " +
                     " | ".join(cell(e) for e in release["units"]) + " |")
    t = data["totals"]
    lines += ["", f"{t['units_applied']} of {t['units']} release/unit pairs apply as they are, {t['units_ported']} "
              f"with a port, {t['units_missing']} not at all; own tests: {t['tests_passed']} of {t['tests_run']} pass."]
    ports = [e["port"] for r in data["releases"] for e in r["units"] if e["port"]]
    if ports:
        lines += ["", "The ports; each one's cover-letter.txt says what differs from the unit, and why:", ""]
        lines += [f"- `{port}/`" for port in ports]
    failing = [(r["release"], e["unit"], test) for r in data["releases"] for e in r["units"] if e["tests"]
               for test in e["tests"]["not_passing"]]
    if failing:
        lines += ["", "Not passing:", ""] + [f"- {release} {unit}: `{test}`" for release, unit, test in failing]
    return "\n".join(lines) + "\n"


def totals(releases):
    entries = [e for r in releases for e in r["units"]]
    tested = [e["tests"] for e in entries if e["tests"]]
    return {"units": len(entries), "units_applied": sum(e["apply"] == APPLIES for e in entries),
            "units_ported": sum(e["apply"] == PORTED for e in entries),
            "units_missing": sum(e["apply"] not in (APPLIES, PORTED) for e in entries),
            "tests_run": sum(t["run"] for t in tested), "tests_passed": sum(t["passed"] for t in tested)}


def complete(data):
    """Problems that keep DATA from saying "every release has every unit, and its tests pass"."""
    problems = []
    for release in data["releases"]:
        if not release["fix_8148"]:
            problems.append(f"{release['release']} lacks upstream's fix #8148")
        for entry in release["units"]:
            if entry["apply"] not in (APPLIES, PORTED):
                problems.append(f"{release['release']} {entry['unit']}: {entry['apply']}")
            if entry["tests"] and entry["tests"]["not_passing"]:
                problems.append(f"{release['release']} {entry['unit']}: not passing: "
                                f"{', '.join(entry['tests']['not_passing'])}")
    return problems


def stale(data, units):
    """How the committed DATA differs from the patches now, without building anything: the units (UNITS, from
    patches/v0.19.8/batches) and their patches, the ports and theirs; [] when it is current."""
    problems = []
    recorded = [(u["unit"], u["patches"]) for u in data["units"]]
    current = [(unit, patch_ids(FOLLOWUP, patches)) for unit, patches in units.items()]
    if recorded != current:
        problems.append("the units or their patches in patches/v0.19.8 changed")
    used = set()
    for release in data["releases"]:
        for entry in release["units"]:
            if entry["port"]:
                used.add(entry["port"])
                directory = REPO / entry["port"]
                if entry.get("port_patches") != patch_ids(directory, port_patches(release["release"], entry["unit"])):
                    problems.append(f"the port {entry['port']} changed")
                if ported_from(directory) != dict(current).get(entry["unit"]):
                    problems.append(f"the port {entry['port']} was made from another version of {entry['unit']}: "
                                    f"port it again (--prepare-port {release['release']} {entry['unit']}, "
                                    "then --export-port)")
    for series in sorted(PORTS.glob("*/*/series")):
        if series.parent.relative_to(REPO).as_posix() not in used:
            problems.append(f"the port {series.parent.relative_to(REPO)} is not in the table")
    return problems


def apply_columns(data):
    """What --check compares: the units' and ports' patches, how each unit got on, the commit it made."""
    return {"units": [(u["unit"], [p["patch_id"] for p in u["patches"]]) for u in data["units"]],
            "releases": [(r["release"], r["base_commit"], [(e["unit"], e["apply"], e["port"], e["commit"],
                                                            [p["patch_id"] for p in e.get("port_patches", [])])
                                                           for e in r["units"]]) for r in data["releases"]]}


# --------------------------------------------------------------------------- ports


def tree_before(release, unit, units):
    """A clone of RELEASE with the units before UNIT on it, at build/followup-releases/port-RELEASE-UNIT."""
    if unit not in units:
        sys.exit(f"followup_releases.py: no unit {unit!r} in {FOLLOWUP}/batches (units: {', '.join(units)})")
    base, _ = build_base(release)
    tree = WORK / f"port-{release}-{unit}"
    fresh_clone(base, tree)
    for earlier, patches in units.items():
        if earlier == unit:
            return tree
        status = apply_unit(tree, release, earlier, patches)
        if status not in (APPLIES, PORTED):
            sys.exit(f"followup_releases.py: the earlier unit {earlier} does not get on {release} ({status}): "
                     "port it first")


def prepare_port(release, unit, units):
    tree = tree_before(release, unit, units)
    sh("git", "-C", tree, "tag", "port-base")
    print(f"{tree}: {release} with the units before {unit}, tag port-base.\n"
          f"Commit the port of each of {unit}'s patches there (git am {FOLLOWUP.relative_to(REPO)}/NNNN-*.patch, "
          f"resolve by hand, git am --continue), write what differs and why in "
          f"{port_dir(release, unit).relative_to(REPO)}/cover-letter.txt (first line: subject), then run\n"
          f"  python scripts/followup_releases.py --export-port {release} {unit}")


def export_port(release, unit, patches):
    tree = WORK / f"port-{release}-{unit}"
    if not (tree / ".git").is_dir():
        sys.exit(f"followup_releases.py: no port tree {tree}: run --prepare-port {release} {unit} first")
    out = port_dir(release, unit)
    if not (out / "cover-letter.txt").is_file():
        sys.exit(f"followup_releases.py: write {out.relative_to(REPO)}/cover-letter.txt first: what differs from "
                 f"{unit} on {release}, and why")
    branch = sh("git", "-C", tree, "symbolic-ref", "--short", "HEAD").stdout.strip()
    proc = sh("bash", REPO / "scripts" / "export-patches.sh", "--tree", tree, "--branch", branch, "--base", "port-base",
              "--out", out, "--cover-letter", out / "cover-letter.txt", check=False)
    sys.stderr.write(proc.stderr)
    if proc.returncode == 0:
        # what the port was made from: a later change to the unit makes it stale (stale() says so)
        made_from = patch_ids(FOLLOWUP, patches)
        (out / "ported-from").write_text("".join(f"{p['file']} {p['patch_id']}\n" for p in made_from))
    return proc.returncode


# --------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", choices=["all", "oldest", "none"], default="all",
                        help="run the units' own tests on every release (default), the oldest, or none")
    parser.add_argument("--check", action="store_true", help="compare with the committed table, write nothing")
    parser.add_argument("--release", action="append", choices=RELEASES, help="only this release (repeatable; "
                        "writes nothing unless all are surveyed)")
    parser.add_argument("--prepare-port", nargs=2, metavar=("RELEASE", "UNIT"))
    parser.add_argument("--export-port", nargs=2, metavar=("RELEASE", "UNIT"))
    parser.add_argument("--markdown", action="store_true", help="only write the markdown table again from the JSON")
    parser.add_argument("--series-for", nargs=2, metavar=("RELEASE", "DIR"),
                        help="write DIR as RELEASE's patch series for scripts/apply.sh (from the committed table)")
    args = parser.parse_args()
    if args.series_for:
        release, dest = args.series_for
        series_for(release, Path(dest).resolve())
        return 0
    units = batches_of(FOLLOWUP)
    if args.markdown:
        data = json.loads(OUT_JSON.read_text())
        OUT_MD.write_text(stamps.stamp_markdown(render(data), data["stamp"]))
        return 0
    if args.prepare_port:
        return prepare_port(*args.prepare_port, units)
    if args.export_port:
        release, unit = args.export_port
        if unit not in units:
            parser.error(f"no unit {unit!r} in {FOLLOWUP}/batches (units: {', '.join(units)})")
        return export_port(release, unit, units[unit])

    WORK.mkdir(parents=True, exist_ok=True)
    releases = args.release or RELEASES
    records = [survey(release, units, args.tests == "all" or (args.tests == "oldest" and release == RELEASES[0]))
               for release in RELEASES if release in releases]
    data = {
        "stamp": stamps.make(FOLLOWUP, ", ".join(r[1:] for r in releases), [f"{r} + follow-up" for r in releases],
                             COMMAND),
        "schema": SCHEMA,
        "generated": datetime.date.today().isoformat(),
        "environment": f"CPU, world size 1 and 2 (LOCAL_SIZE=2), torch {torch_version()}, tests run: {args.tests}",
        "units": [{"unit": unit, "patches": patch_ids(FOLLOWUP, patches)} for unit, patches in units.items()],
        "releases": records,
    }
    data["totals"] = totals(records)
    problems = complete(data)
    if args.check:
        committed = json.loads(OUT_JSON.read_text())
        want = apply_columns(committed)
        got = apply_columns(data)
        if args.release:
            want["releases"] = [r for r in want["releases"] if r[0] in releases]
        problems += stale(committed, units)
        if want != got:
            problems.append(f"{OUT_JSON.relative_to(REPO)} is not current (a unit's or port's patches, or how a unit "
                            f"applies, changed): regenerate it with python scripts/followup_releases.py")
    elif args.release and sorted(args.release) != RELEASES:
        print("followup_releases.py: some releases only: nothing written")
    else:
        OUT_JSON.write_text(json.dumps(data, indent=1) + "\n")
        OUT_MD.write_text(stamps.stamp_markdown(render(data), data["stamp"]))
        print(f"wrote {OUT_JSON.relative_to(REPO)} and {OUT_MD.name}")
    t = data["totals"]
    print(f"{t['units_applied']} of {t['units']} release/unit pairs apply as they are, {t['units_ported']} ported, "
          f"{t['units_missing']} missing; own tests: {t['tests_passed']}/{t['tests_run']} pass")
    for problem in problems:
        print(f"NOT OK: {problem}")
    return 1 if problems else 0


def series_for(release, dest):
    """Writes DEST as a patch directory for apply.sh: the follow-up's units on RELEASE, in merge order, each as
    it is or by its port, as the committed table says they go on. Returns the number of patches."""
    data = json.loads(OUT_JSON.read_text())
    entry = next((r for r in data["releases"] if r["release"] == release), None)
    if entry is None:
        sys.exit(f"followup_releases.py: {release} is not in {OUT_JSON.relative_to(REPO)} "
                 f"(releases: {', '.join(r['release'] for r in data['releases'])})")
    units = batches_of(FOLLOWUP)
    if dest.exists():
        # only a directory this wrote before is replaced
        strays = [p.name for p in dest.iterdir() if p.name != "series" and not p.name.endswith(".patch")]
        if strays:
            sys.exit(f"followup_releases.py: {dest} holds other files than a patch series ({', '.join(strays)}); "
                     "name a new directory")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    names = []
    for record in entry["units"]:
        unit = record["unit"]
        if record["apply"] == APPLIES:
            sources = [FOLLOWUP / name for name in units[unit]]
        elif record["apply"] == PORTED:
            sources = [port_dir(release, unit) / name for name in port_patches(release, unit)]
        else:
            sys.exit(f"followup_releases.py: {unit} does not go on {release} ({record['apply']}): no series for it")
        for source in sources:
            # numbered again in the order they go on; the rest of the name is the unit's or port's
            names.append(f"{len(names) + 1:04d}-{source.name.split('-', 1)[1]}")
            shutil.copyfile(source, dest / names[-1])
    (dest / "series").write_text("".join(name + "\n" for name in names))
    how = ", ".join(f"{r['unit']} {'as it is' if r['apply'] == APPLIES else 'ported'}" for r in entry["units"])
    print(f"followup_releases.py: {dest}: the follow-up for {release}, {len(names)} patches ({how})")
    return len(names)


def torch_version():
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, env=dict(os.environ))
    return proc.stdout.strip() or "not importable"


if __name__ == "__main__":
    sys.exit(main())
