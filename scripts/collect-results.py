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
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEST_FILES = ["tests/test_frozen_ckpt.py", "tests/test_hf_llama_peft.py"]
OUTCOMES = {"passed": "passed", "failed as expected": "failed", "failed": "failed"}


def test_metadata():
    """function name -> (first docstring line, invariants) for the scenario tests."""
    meta = {}
    for name in TEST_FILES:
        tree = ast.parse((ROOT / name).read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            invariants = []
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == "invariants"):
                    invariants += [arg.value for arg in decorator.args if isinstance(arg, ast.Constant)]
            meta[node.name] = (doc[0] if doc else "", invariants)
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="COLUMN=PATH")
    parser.add_argument("--environment", default="CPU, 2 ranks (gloo)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "_generated" / "test-matrix.json"))
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
    scenarios = []
    for test_id in sorted(results):
        function = test_id.split("::")[-1].split("[")[0]
        checks, invariants = meta.get(function, ("", []))
        row = results[test_id]
        scenarios.append({
            "id": test_id,
            "title": test_id.split("::")[-1].removeprefix("test_").replace("_", " "),
            "checks": checks or "see the scenario's docstring in tests/scenarios/",
            "invariants": invariants,
            "results": {
                column: row.get(column, "not-run")
                for column in columns
            },
        })
    matrix = {
        "schema": "zero3-test-matrix/1",
        "environment": args.environment,
        "base": "DeepSpeed v0.19.2 (b919284ab1ad6dbc1cb0e06b10386ff74160b586)",
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
