"""Find the tests that claim to check an RFC invariant, without importing them.

A test claims invariants with the pytest marker ``invariants``::

    @pytest.mark.invariants("I1", "I4")
    def test_something(): ...

on a test function, a test method or a test class, or for a whole module with
``pytestmark = pytest.mark.invariants("I2")`` (a single mark, or a list or tuple of
marks).  The scan reads source text with :mod:`ast` only: importing the test
modules would import torch and DeepSpeed, which the documentation build must not
need.  It reads the project's own tests and the test files that the patch series
adds to DeepSpeed (new files in ``git format-patch`` output).

This module is pure Python so that tests/test_docs.py can unit-test it without
Sphinx; docs/_ext/invariants.py turns its results into build errors and pages.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

MARK_NAME = "invariants"
# RFC invariant ids are "I" followed by a positive number: I1 ... I12.
INVARIANT_ID = re.compile(r"^I[1-9][0-9]*$")


@dataclass(frozen=True)
class Claim:
    """One test (or class, or module) that declares the invariants it checks."""

    test: str  # pytest-style node id, e.g. "tests/scenarios/test_x.py::TestA::test_b"
    invariants: Tuple[str, ...]
    origin: str  # file that holds the marker, relative to the scan root (.py or .patch)
    lineno: int  # line of the marker in ``origin``


@dataclass(frozen=True)
class Problem:
    """Something in a scanned file that the docs build must report."""

    origin: str
    lineno: int
    message: str


@dataclass
class ScanResult:
    claims: List[Claim] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    scanned: List[str] = field(default_factory=list)

    def by_invariant(self) -> dict:
        """Map each invariant id to the claims that name it, in scan order."""
        result: dict = {}
        for claim in self.claims:
            for inv in claim.invariants:
                result.setdefault(inv, []).append(claim)
        return result


def _is_invariants_mark(node: ast.AST) -> bool:
    """``pytest.mark.invariants(...)`` or ``mark.invariants(...)`` (from pytest import mark)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == MARK_NAME):
        return False
    owner = func.value
    if isinstance(owner, ast.Attribute):
        return owner.attr == "mark"
    return isinstance(owner, ast.Name) and owner.id == "mark"


def _mark_ids(call: ast.Call, origin: str, line_offset: int, problems: List[Problem]) -> Optional[Tuple[str, ...]]:
    """The invariant ids of one marker call, or None (and a problem) if they are not literal."""
    lineno = call.lineno + line_offset
    if call.keywords:
        problems.append(Problem(origin, lineno, "pytest.mark.invariants takes only positional ids"))
        return None
    if not call.args:
        problems.append(Problem(origin, lineno, "pytest.mark.invariants() names no invariant"))
        return None
    ids = []
    for arg in call.args:
        # Ids must be readable without running the code, hence string literals only.
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            problems.append(
                Problem(origin, lineno, "pytest.mark.invariants ids must be string literals such as \"I1\""))
            return None
        if not INVARIANT_ID.match(arg.value):
            problems.append(
                Problem(origin, lineno, f"{arg.value!r} is not an invariant id (expected I<number>, e.g. \"I1\")"))
            return None
        ids.append(arg.value)
    return tuple(dict.fromkeys(ids))  # keep order, drop repeats


def _marks_in_value(value: ast.AST) -> Iterator[ast.Call]:
    """The invariants marks in a ``pytestmark = ...`` right-hand side."""
    if isinstance(value, (ast.List, ast.Tuple)):
        for elt in value.elts:
            if _is_invariants_mark(elt):
                yield elt
    elif _is_invariants_mark(value):
        yield value


def _pytestmark_assignments(body: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
                yield stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            if isinstance(stmt.target, ast.Name) and stmt.target.id == "pytestmark":
                yield stmt.value


def scan_source(source: str, test_path: str, origin: Optional[str] = None, line_offset: int = 0) -> ScanResult:
    """Scan one Python test module.

    ``test_path`` is the path that goes into the node ids; ``origin`` is the file that
    holds the text (the same file, or the .patch that adds it) and ``line_offset`` maps
    module line numbers to lines of ``origin``.
    """
    origin = origin or test_path
    result = ScanResult(scanned=[origin])
    try:
        tree = ast.parse(source, filename=test_path)
    except SyntaxError as exc:
        result.problems.append(Problem(origin, (exc.lineno or 0) + line_offset, f"cannot parse {test_path}: {exc.msg}"))
        return result

    def add(test_id: str, call: ast.Call, what: str, name: str) -> None:
        ids = _mark_ids(call, origin, line_offset, result.problems)
        if ids is None:
            return
        # A marker on something pytest does not collect would be a claim no test backs.
        if what == "function" and not name.startswith("test"):
            result.problems.append(
                Problem(origin, call.lineno + line_offset,
                        f"{test_id}: pytest.mark.invariants on a function that is not a test (name must start with 'test')"))
            return
        if what == "class" and not name.startswith("Test"):
            result.problems.append(
                Problem(origin, call.lineno + line_offset,
                        f"{test_id}: pytest.mark.invariants on a class that is not a test class (name must start with 'Test')"))
            return
        result.claims.append(Claim(test_id, ids, origin, call.lineno + line_offset))

    def visit(body: Sequence[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                test_id = f"{prefix}::{stmt.name}"
                what = "class" if isinstance(stmt, ast.ClassDef) else "function"
                for deco in stmt.decorator_list:
                    if _is_invariants_mark(deco):
                        add(test_id, deco, what, stmt.name)
                if isinstance(stmt, ast.ClassDef):
                    for value in _pytestmark_assignments(stmt.body):
                        for call in _marks_in_value(value):
                            add(test_id, call, "class", stmt.name)
                    visit(stmt.body, test_id)

    for value in _pytestmark_assignments(tree.body):
        for call in _marks_in_value(value):
            ids = _mark_ids(call, origin, line_offset, result.problems)
            if ids is not None:
                result.claims.append(Claim(test_path, ids, origin, call.lineno + line_offset))
    visit(tree.body, test_path)
    return result


@dataclass
class PatchedFile:
    path: str  # path inside the patched tree (b/ side)
    new: bool
    lines: List[str]  # added lines, without the leading "+"
    first_line: int  # line of the patch file where the first added line sits (1-based)


def _patched_files(text: str) -> Iterator[PatchedFile]:
    """The files of a git patch with their added lines.

    For a new file the added lines are the whole file; a changed file cannot be
    rebuilt from the patch alone, so it is returned with ``new=False``.
    """
    current: Optional[PatchedFile] = None
    in_hunk = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("diff --git "):
            if current is not None:
                yield current
            current = PatchedFile(path="", new=False, lines=[], first_line=0)
            in_hunk = False
            continue
        if current is None:
            continue
        if not in_hunk:
            if line.startswith("new file mode"):
                current.new = True
            elif line.startswith("+++ "):
                target = line[4:].strip()
                current.path = target[2:] if target.startswith("b/") else target
            elif line.startswith("@@"):
                in_hunk = True
            continue
        if line.startswith("@@"):
            continue
        if line.startswith("+"):
            if not current.lines:
                current.first_line = number
            current.lines.append(line[1:])
        elif line.startswith("-- ") or line == "--":
            # the signature separator that format-patch appends ends the last hunk
            in_hunk = False
    if current is not None:
        yield current


def scan_patch(text: str, origin: str) -> ScanResult:
    """Scan the Python test files that a ``git format-patch`` file adds."""
    result = ScanResult(scanned=[origin])
    for pf in _patched_files(text):
        if not pf.path.endswith(".py") or not pf.lines:
            continue
        if not pf.new:
            if any("mark." + MARK_NAME in line for line in pf.lines):
                result.problems.append(
                    Problem(origin, pf.first_line,
                            f"{pf.path}: invariants markers in a changed (not new) file cannot be read from the patch; "
                            "add them in a file that the patch creates"))
            continue
        if not Path(pf.path).name.startswith("test"):
            continue
        sub = scan_source("\n".join(pf.lines) + "\n", pf.path, origin=origin, line_offset=pf.first_line - 1)
        result.claims.extend(sub.claims)
        result.problems.extend(sub.problems)
    return result


def _expand(root: Path, patterns: Iterable[str]) -> List[Path]:
    found = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts and path not in found:
                found.append(path)
    return found


def scan_tree(root: Path, test_globs: Iterable[str], patch_globs: Iterable[str]) -> ScanResult:
    """Scan the project's test modules and the test files added by its patches."""
    root = Path(root)
    total = ScanResult()
    for path in _expand(root, test_globs):
        rel = path.relative_to(root).as_posix()
        part = scan_source(path.read_text(encoding="utf-8"), rel)
        total.claims.extend(part.claims)
        total.problems.extend(part.problems)
        total.scanned.extend(part.scanned)
    for path in _expand(root, patch_globs):
        rel = path.relative_to(root).as_posix()
        part = scan_patch(path.read_text(encoding="utf-8", errors="replace"), rel)
        total.claims.extend(part.claims)
        total.problems.extend(part.problems)
        total.scanned.extend(part.scanned)
    return total


def check(declared: Iterable[str], result: ScanResult, require_tests: bool = True) -> List[Problem]:
    """The consistency problems between declared invariants and test claims.

    Every declared invariant needs at least one claiming test (unless
    ``require_tests`` is off), and every claimed id must be declared.
    """
    declared = list(declared)
    known = set(declared)
    problems = list(result.problems)
    claimed = result.by_invariant()
    for claim in result.claims:
        unknown = [inv for inv in claim.invariants if inv not in known]
        if unknown:
            problems.append(
                Problem(claim.origin, claim.lineno,
                        f"{claim.test} claims unknown invariant(s) {', '.join(unknown)}; "
                        f"the RFC declares {', '.join(sorted(known, key=_id_key)) or 'none'}"))
    if require_tests:
        for inv in declared:
            if inv not in claimed:
                problems.append(
                    Problem("", 0, f"invariant {inv} has no test: mark a test that checks it with "
                            f"@pytest.mark.invariants(\"{inv}\")"))
    return problems


def _id_key(inv: str) -> int:
    return int(inv[1:]) if INVARIANT_ID.match(inv) else 0
