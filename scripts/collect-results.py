#!/usr/bin/env python3
"""Turn the scenario suite's result files into docs/_generated/test-matrix.json.

Each input is the JSON-lines file a run wrote through ZERO3_RESULTS_FILE, named as
COLUMN=PATH, e.g. `pristine=res-0.jsonl prefix-1=res-1.jsonl series=res-3.jsonl`. The tests'
docstrings and invariants markers are read from the test sources with ast (nothing is imported).

    python scripts/collect-results.py --environment "CPU, 2 ranks (gloo)" pristine=a.jsonl series=b.jsonl
"""

import argparse
import ast
import datetime
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import stamps  # noqa: E402
TEST_FILES = ["tests/test_frozen_ckpt.py", "tests/test_hf_llama_peft.py"]
OUTCOMES = {"passed": "passed", "failed as expected": "failed", "failed": "failed"}


def pinned_base(version):
    """(upstream commit or "-", sdist name, sdist sha256) of VERSION in scripts/pinned-bases.tsv."""
    for line in (ROOT / "scripts" / "pinned-bases.tsv").read_text().splitlines():
        fields = line.split("\t")
        if line and not line.startswith("#") and fields[0] == version:
            return fields[1], fields[2], fields[3]
    sys.exit(f"collect-results.py: {version} is not pinned in scripts/pinned-bases.tsv")


def first_sentence(doc):
    """The docstring's first sentence (it may span lines), for the matrix's "What it checks"."""
    text = " ".join(doc.split("\n\n", 1)[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


def scenario_docstring(node, constants):
    """The docstring of the scenario a test runs: most tests are one call such as
    scenario(f"{FROZEN}:lora", ...), whose scenario function (tests/scenarios/frozen_ckpt.py:lora)
    documents what is checked."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        target = call.args[0]
        if isinstance(target, ast.JoinedStr):
            text = "".join(
                constants.get(part.value.id, "") if isinstance(part, ast.FormattedValue)
                and isinstance(part.value, ast.Name) else getattr(part, "value", "") for part in target.values)
        elif isinstance(target, ast.Constant) and isinstance(target.value, str):
            text = target.value
        else:
            continue
        module, sep, function = text.partition(":")
        path = ROOT / (module.replace(".", "/") + ".py")
        if not sep or not path.is_file():
            continue
        for item in ast.parse(path.read_text()).body:
            if isinstance(item, ast.FunctionDef) and item.name == function:
                return ast.get_docstring(item) or ""
    return ""


def test_metadata():
    """function name -> (first docstring sentence, invariants) for the scenario tests: the test's
    own docstring, else that of the scenario function it runs."""
    meta = {}
    for name in TEST_FILES:
        tree = ast.parse((ROOT / name).read_text())
        constants = {
            node.targets[0].id: node.value.value
            for node in tree.body if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        }
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            doc = (ast.get_docstring(node) or scenario_docstring(node, constants)).strip()
            invariants = []
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == "invariants"):
                    invariants += [arg.value for arg in decorator.args if isinstance(arg, ast.Constant)]
            meta[node.name] = (first_sentence(doc), invariants)
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="COLUMN=PATH")
    parser.add_argument("--environment", default="CPU, 2 ranks (gloo)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "_generated" / "test-matrix.json"))
    parser.add_argument("--series", default="v0.19.2", help="the series directory under patches/ the runs tested")
    args = parser.parse_args()

    columns, results = [], {}
    for run in args.runs:
        column, sep, path = run.partition("=")
        if not sep or not column or not pathlib.Path(path).is_file():
            sys.exit(f"collect-results.py: expected COLUMN=PATH to an existing results file, got {run!r}")
        columns.append(column)
        for line in pathlib.Path(path).read_text().splitlines():
            record = json.loads(line)
            outcome = record["outcome"]
            result = OUTCOMES.get(outcome, "passed" if outcome.startswith("passed") else "error")
            detail = outcome if outcome not in ("passed", "failed") else ""
            if record["failure"] and result == "failed":
                detail = (detail + ": " if detail else "") + record["failure"]
            results.setdefault(record["test"], {})[column] = {
                "outcome": result,
                "detail": detail
            } if detail else result

    meta = test_metadata()
    undocumented = sorted({t.split("::")[-1].split("[")[0] for t in results} - {n for n, m in meta.items() if m[0]})
    if undocumented:
        sys.exit("collect-results.py: these tests, and the scenario functions they run, have no docstring, "
                 "whose first sentence the matrix shows as what they check: " + ", ".join(undocumented))
    scenarios = []
    for test_id in sorted(results):
        function = test_id.split("::")[-1].split("[")[0]
        checks, invariants = meta.get(function, ("", []))
        row = results[test_id]
        scenarios.append({
            "id": test_id,
            "title": test_id.split("::")[-1].removeprefix("test_").replace("_", " "),
            "checks": checks,
            "invariants": invariants,
            "results": {
                column: row.get(column, "not-run")
                for column in columns
            },
        })
    patch_dir = ROOT / "patches" / args.series
    commit, sdist, sha = pinned_base(args.series)
    suffix = "" if args.series == "v0.19.2" else "-v0198" if args.series == "v0.19.8" else "-backport"
    stamp = stamps.make(patch_dir, deepspeed=args.series[1:], trees=columns,
                        command=(f"ZERO3_RESULTS_FILE=<file> tox -e pristine{suffix} / tox -e cpu{suffix} -- "
                                 "tests/test_frozen_ckpt.py tests/test_hf_llama_peft.py, then scripts/collect-results.py "
                                 f"--series {args.series} <column>=<pristine file> <column>=<patched file> "
                                 "(docs/generated-inputs.md)"))
    matrix = {
        "stamp": stamp,
        "schema": "zero3-test-matrix/1",
        "environment": args.environment,
        "base": f"DeepSpeed {args.series} ({commit})" if commit != "-" else
                f"DeepSpeed {args.series} (PyPI sdist {sdist}, sha256 {sha})",
        "series": f"patches/{args.series}, {stamp['patches']} patches, series id {stamp['series_id']}",
        "generated": datetime.date.today().isoformat(),
        "columns": [{
            "key": c,
            "title": c
        } for c in columns],
        "scenarios": scenarios,
    }
    pathlib.Path(args.out).write_text(json.dumps(matrix, indent=1) + "\n")
    print(f"wrote {args.out}: {len(scenarios)} scenarios x {len(columns)} columns")


if __name__ == "__main__":
    main()
