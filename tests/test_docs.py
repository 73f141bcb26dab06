"""Tests of the documentation site: its Sphinx extensions, the built pages, and their links.

The rendered pages are measured in headless Chromium (test_rendered_pages, with
docs_render_check.js): both furo themes, 1280 and 390 px, widths of tables and figures against
the column, WCAG contrast of this project's styled text, diagram label sizes. The generated
inputs' stamps are checked against the series in patches/ (docs/_ext/stamps.py).

The unit tests of the extensions' collection logic need only the standard library.  The
build tests need Sphinx (docs/requirements.txt; the tox env ``docs`` has it) and are
skipped without it.  Where Sphinx is installed they also need Graphviz's ``dot`` and, for
the rendered-page check, Debian's headless ``chromium``: outside CI a missing one skips
those tests, in CI (env CI=true) it fails them with the command that installs it.

Environment knobs for development:
  DOCS_BUILD_DIR    use an existing HTML build (e.g. docs/_build/html from tox -e docs)
                    instead of building into a temporary directory.
  DOCS_SPHINX_ARGS  extra sphinx-build arguments, e.g. "-D generated_dir=/tmp/gen".
"""

import html
import html.parser
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RFC = ROOT / "rfc" / "zero3-parameter-lifecycle.md"
sys.path.insert(0, str(DOCS / "_ext"))

import invariant_scan  # noqa: E402
import sequence  # noqa: E402
import stamps  # noqa: E402
from generated import MatrixError, invariants_by_batch, load_matrix, read_batches, read_series  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(condition, what, install):
    """Skip when a tool is missing on a developer machine; fail in CI, saying how to install it."""
    if condition:
        return
    message = f"{what} is not available; install it with: {install}"
    if IN_CI:
        pytest.fail(message + " (.ci/run must do this)")
    pytest.skip(message)


def have_sphinx():
    try:
        import sphinx  # noqa: F401
        import myst_parser  # noqa: F401
    except ImportError:
        return False
    return True


def need_sphinx():
    # Sphinx is a property of the environment running the tests (tox -e docs installs
    # docs/requirements.txt; the CPU and GPU envs do not), so its absence always skips.
    if not have_sphinx():
        pytest.skip("Sphinx/myst-parser not installed: run these tests with tox -e docs "
                    "(or pip install -r docs/requirements.txt)")


# --------------------------------------------------------------------------- invariant scan


def test_scan_function_method_class_and_module_markers():
    source = textwrap.dedent('''
        import pytest
        from pytest import mark

        pytestmark = [pytest.mark.slow, pytest.mark.invariants("I9")]

        @pytest.mark.invariants("I1", "I2", "I1")
        def test_plain():
            pass

        @mark.invariants("I3")
        def test_bare_mark():
            pass

        @pytest.mark.parametrize("x", [1])
        @pytest.mark.invariants("I4")
        class TestGroup:
            pytestmark = pytest.mark.invariants("I5")

            @pytest.mark.invariants("I6")
            def test_method(self, x):
                pass

            def test_unmarked(self):
                pass

        def test_unmarked():
            "pytest.mark.invariants('I7') in a string is not a marker"
    ''')
    result = invariant_scan.scan_source(source, "tests/scenarios/test_x.py")
    assert result.problems == []
    got = {(c.test, c.invariants) for c in result.claims}
    assert got == {
        ("tests/scenarios/test_x.py", ("I9",)),
        ("tests/scenarios/test_x.py::test_plain", ("I1", "I2")),
        ("tests/scenarios/test_x.py::test_bare_mark", ("I3",)),
        ("tests/scenarios/test_x.py::TestGroup", ("I4",)),
        ("tests/scenarios/test_x.py::TestGroup", ("I5",)),
        ("tests/scenarios/test_x.py::TestGroup::test_method", ("I6",)),
    }
    plain = next(c for c in result.claims if c.test.endswith("::test_plain"))
    assert plain.lineno == 7 and plain.origin == "tests/scenarios/test_x.py"
    assert set(result.by_invariant()) == {"I1", "I2", "I3", "I4", "I5", "I6", "I9"}


@pytest.mark.parametrize(
    "decorator, message",
    [
        ("@pytest.mark.invariants(INV)", "string literals"),
        ("@pytest.mark.invariants()", "names no invariant"),
        ("@pytest.mark.invariants('X1')", "is not an invariant id"),
        ("@pytest.mark.invariants('I0')", "is not an invariant id"),
        ("@pytest.mark.invariants(ids='I1')", "positional"),
    ],
)
def test_scan_rejects_malformed_markers(decorator, message):
    source = f"import pytest\nINV = 'I1'\n{decorator}\ndef test_a():\n    pass\n"
    result = invariant_scan.scan_source(source, "tests/test_a.py")
    assert result.claims == []
    assert len(result.problems) == 1 and message in result.problems[0].message
    assert result.problems[0].lineno == 3


def test_scan_rejects_markers_on_things_pytest_does_not_collect():
    source = textwrap.dedent('''
        import pytest
        @pytest.mark.invariants("I1")
        def helper():
            pass
        @pytest.mark.invariants("I2")
        class Helper:
            pass
    ''')
    result = invariant_scan.scan_source(source, "tests/test_a.py")
    assert result.claims == []
    assert [p.lineno for p in result.problems] == [3, 6]


def test_scan_reports_syntax_errors():
    result = invariant_scan.scan_source("def test_a(:\n", "tests/test_bad.py")
    assert result.claims == [] and "cannot parse" in result.problems[0].message


PATCH = textwrap.dedent('''\
    From 0123456789abcdef Mon Sep 17 00:00:00 2001
    From: The maintainers <m@example.invalid>
    Subject: [PATCH 4/4] tests: ZeRO-3 frozen params under checkpointing

    ---
     tests/unit/v1/zero/test_zero3_frozen_checkpoint.py | 9 +++++++++
     deepspeed/runtime/zero/x.py | 2 +-
    diff --git a/deepspeed/runtime/zero/x.py b/deepspeed/runtime/zero/x.py
    index 1111111..2222222 100644
    --- a/deepspeed/runtime/zero/x.py
    +++ b/deepspeed/runtime/zero/x.py
    @@ -1,2 +1,2 @@
     keep = 1
    -old = 2
    +new = 2
    diff --git a/tests/unit/v1/zero/test_zero3_frozen_checkpoint.py b/tests/unit/v1/zero/test_zero3_frozen_checkpoint.py
    new file mode 100644
    index 0000000..3333333
    --- /dev/null
    +++ b/tests/unit/v1/zero/test_zero3_frozen_checkpoint.py
    @@ -0,0 +1,9 @@
    +import pytest
    +from unit.common import DistributedTest
    +
    +
    +@pytest.mark.invariants("I1", "I2")
    +class TestFrozen(DistributedTest):
    +    @pytest.mark.invariants("I5")
    +    def test_no_grad_input(self):
    +        pass
    --
    2.39.5
''')


def test_scan_patch_reads_the_test_files_a_patch_adds():
    result = invariant_scan.scan_patch(PATCH, "patches/0004-tests.patch")
    assert result.problems == []
    path = "tests/unit/v1/zero/test_zero3_frozen_checkpoint.py"
    assert [(c.test, c.invariants, c.origin, c.lineno) for c in result.claims] == [
        (f"{path}::TestFrozen", ("I1", "I2"), "patches/0004-tests.patch", 26),
        (f"{path}::TestFrozen::test_no_grad_input", ("I5",), "patches/0004-tests.patch", 28),
    ]
    assert PATCH.splitlines()[26 - 1] == '+@pytest.mark.invariants("I1", "I2")'


def test_scan_patch_refuses_markers_it_cannot_read():
    patch = PATCH.replace("+++ b/deepspeed/runtime/zero/x.py", "+++ b/tests/unit/test_old.py").replace(
        "+new = 2", '+@pytest.mark.invariants("I3")')
    result = invariant_scan.scan_patch(patch, "patches/0004-tests.patch")
    assert any("changed (not new) file" in p.message for p in result.problems)


def test_scan_tree_and_check(tmp_path):
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "sub" / "test_a.py").write_text(
        'import pytest\n@pytest.mark.invariants("I1", "I13")\ndef test_a():\n    pass\n')
    (tmp_path / "tests" / "__pycache__").mkdir()
    (tmp_path / "tests" / "__pycache__" / "test_a.py").write_text('@pytest.mark.invariants("I99")\ndef test_x(): 0\n')
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "0004-tests.patch").write_text(PATCH)
    (tmp_path / "patches" / "series").write_text("0004-tests.patch\n")
    result = invariant_scan.scan_tree(tmp_path, ["tests/**/*.py"], ["patches/[0-9]*.patch"])
    assert sorted({c.origin for c in result.claims}) == ["patches/0004-tests.patch", "tests/sub/test_a.py"]

    problems = invariant_scan.check(["I1", "I2", "I3", "I5"], result)
    messages = [p.message for p in problems]
    assert any("claims unknown invariant(s) I13" in m for m in messages)
    assert any(m.startswith("invariant I3 has no test") for m in messages)
    assert len(messages) == 2
    relaxed = invariant_scan.check(["I1", "I2", "I3", "I5"], result, require_tests=False)
    assert [p.message for p in relaxed] == [m for m in messages if "unknown" in m]


# --------------------------------------------------------------------------- other extensions


MATRIX = {
    "schema": "zero3-test-matrix/1",
    "columns": [{"key": "pristine", "title": "v0.19.2"}, {"key": "patched", "title": "patched"}],
    "scenarios": [{
        "id": "tests/scenarios/test_x.py::test_a",
        "title": "LN then Linear",
        "checks": "no CheckpointError",
        "invariants": ["I1"],
        "results": {"pristine": {"outcome": "failed", "detail": "CheckpointError"}, "patched": "passed"},
    }],
}


def test_matrix_accepts_the_documented_format():
    assert load_matrix(json.dumps(MATRIX))["scenarios"][0]["id"].endswith("test_a")
    # The example on the "Generated inputs" page is itself a valid file.
    page = (DOCS / "generated-inputs.md").read_text(encoding="utf-8")
    example = page.split("```json", 1)[1].split("```", 1)[0]
    load_matrix(example)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: m.update(schema="x"), "schema"),
        (lambda m: m["scenarios"][0]["results"].pop("patched"), "no result for column 'patched'"),
        (lambda m: m["scenarios"][0]["results"].update(gpu="passed"), "unknown column 'gpu'"),
        (lambda m: m["scenarios"][0]["results"].update(patched="green"), "outcome 'green'"),
        (lambda m: m["scenarios"][0].pop("checks"), "checks"),
        (lambda m: m.update(columns=[]), "columns"),
    ],
)
def test_matrix_rejects_malformed_files(mutate, message):
    data = json.loads(json.dumps(MATRIX))
    mutate(data)
    with pytest.raises(MatrixError, match=re.escape(message)):
        load_matrix(json.dumps(data))


def test_read_series(tmp_path):
    (tmp_path / "series").write_text("# the series\n0004-tests.patch\n\n")
    (tmp_path / "0004-tests.patch").write_text(PATCH.replace(
        "Subject: [PATCH 4/4] tests: ZeRO-3 frozen params under checkpointing",
        "Subject: [PATCH 4/4] tests: ZeRO-3 frozen params under\n checkpointing"))
    (patch, ) = read_series(tmp_path)
    assert patch["subject"] == "tests: ZeRO-3 frozen params under checkpointing"
    assert patch["files"] == [
        {"path": "deepspeed/runtime/zero/x.py", "new": False},
        {"path": "tests/unit/v1/zero/test_zero3_frozen_checkpoint.py", "new": True},
    ]
    (tmp_path / "series").write_text("0005-missing.patch\n")
    with pytest.raises(MatrixError, match="does not exist"):
        read_series(tmp_path)


def test_invariants_by_batch_counts_each_scenario_under_the_batch_it_needs(tmp_path):
    batches = tmp_path / "batches"
    batches.write_text("# merge order\nfirst 0002 0001\nsecond 0003\n")
    assert read_batches(batches) == {2: "first", 1: "first", 3: "second"}
    matrix = {"columns": [{"key": "v0.19.8", "title": "v0.19.8"}, {"key": "follow-up", "title": "follow-up"}],
              "scenarios": [
                  {"id": "t.py::test_a[x]", "invariants": ["I1", "I2"], "results": {"v0.19.8": "failed", "follow-up": "passed"}},
                  {"id": "t.py::test_b", "invariants": ["I1"], "results": {"v0.19.8": "failed", "follow-up": "passed"}},
                  {"id": "t.py::test_c", "invariants": ["I2"], "results": {"v0.19.8": "passed", "follow-up": "passed"}},
                  {"id": "t.py::test_d", "invariants": ["I2"], "results": {"v0.19.8": "failed", "follow-up": "failed"}},
              ]}
    need = {"test_a[x]": 1, "test_b": 3, "test_c": 0, "test_d": 99}
    table, names = invariants_by_batch(matrix, need.get, read_batches(batches))
    assert names == ["first", "second"]
    assert table == {"I1": {"first": 1, "second": 1}, "I2": {"first": 1, "guard": 1, "open": 1}}
    need["test_b"] = 7  # a regression test whose patch is in no batch
    with pytest.raises(MatrixError, match="test_b fails on v0.19.8 and passes with follow-up"):
        invariants_by_batch(matrix, need.get, read_batches(batches))


def test_sequence_parse_and_layout():
    diagram = sequence.parse("a = Engine; b = Hooks; p = Param", [
        "== Forward ==",
        "a -> b : pre-forward",
        "b --> a : * done",
        "p : AVAILABLE {lin}",
        "p : ! CheckpointError",
        "a .. p : a wide note",
    ])
    kinds = [(e.kind, e.style) for e in diagram.events]
    assert kinds == [("phase", "plain"), ("message", "plain"), ("message", "change"), ("note", "AVAILABLE"),
                     ("note", "error"), ("note", "plain")]
    assert diagram.events[2].dashed
    xs = sequence.lane_positions(diagram)
    assert xs == sorted(xs) and xs[1] - xs[0] >= sequence.MIN_GAP
    dot = sequence.to_dot(diagram)
    assert dot.count("pos=") == len(re.findall(r'^\s+"[ehf]\w*" \[', dot, re.M))  # every node is pinned
    if shutil.which("dot"):
        svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
        assert "<svg" in svg and "CheckpointError" in svg


@pytest.mark.parametrize("rows, message", [
    (["x -> a : hi"], "unknown lane 'x'"),
    (["a -> a : hi"], "two different lanes"),
    (["what is this"], "cannot read"),
    ([], "no rows"),
])
def test_sequence_syntax_errors(rows, message):
    with pytest.raises(sequence.SequenceSyntaxError, match=re.escape(message)):
        sequence.parse("a = A; b = B", rows)


# --------------------------------------------------------------------------- stamps of generated inputs


def _series_dir(tmp_path, name="v0.19.2", patches=(PATCH, )):
    directory = tmp_path / "patches" / name
    directory.mkdir(parents=True)
    names = []
    for i, text in enumerate(patches, 1):
        names.append(f"{i:04d}-p.patch")
        (directory / names[-1]).write_text(text)
    (directory / "series").write_text("\n".join(names) + "\n")
    return directory


def _png_bytes():
    # the smallest valid PNG: a 1x1 grey pixel
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


def test_stamps_round_trip_in_markdown_json_and_png(tmp_path):
    series = _series_dir(tmp_path)
    stamp = stamps.make(series, "0.19.2", ["v0.19.2", "series"], "make it")
    assert stamp["series"] == "v0.19.2" and stamp["patches"] == 1 and re.fullmatch(r"[0-9a-f]{12}", stamp["series_id"])
    # re-exporting an unchanged patch (another commit id and date) keeps the id: git patch-id
    reexported = PATCH.replace("0123456789abcdef", "fedcba9876543210").replace("2.39.5", "2.43.0")
    assert stamps.series_id_of([reexported]) == stamp["series_id"]
    assert stamps.series_id_of([PATCH.replace("+new = 2", "+new = 3")]) != stamp["series_id"]
    md, js, png = tmp_path / "t.md", tmp_path / "t.json", tmp_path / "t.png"
    md.write_text("| a |\n|---|\n| 1 |\n")
    js.write_text('{"schema": "x"}')
    png.write_bytes(_png_bytes())
    for path in (md, js, png):
        assert stamps.read(path) is None
        stamps.write(path, stamp)
        stamps.write(path, stamp)  # replaces, never stacks
        assert stamps.read(path) == stamp
    assert md.read_text().count("zero3-stamp") == 1 and stamps.strip_markdown(md.read_text()).startswith("| a |")
    assert json.loads(js.read_text())["schema"] == "x"
    assert png.read_bytes().endswith(_png_bytes()[-12:])  # IEND stays last


def test_stamp_check_names_stale_inputs_and_their_command(tmp_path):
    series = _series_dir(tmp_path)
    generated = tmp_path / "generated"
    (generated / "runs").mkdir(parents=True)
    current = stamps.make(series, "0.19.2", ["series"], "regenerate-current")
    old = dict(current, series_id="0123456789ab", patches=4, command="run the GPU bench")
    for name, stamp in (("fresh.md", current), ("stale.md", old), ("runs/r.json", old)):
        path = generated / name
        path.write_text("{}" if name.endswith(".json") else "text\n")
        stamps.write(path, stamp)
    (generated / "bare.md").write_text("no stamp\n")
    (generated / "README.md").write_text("not an input\n")
    problems = stamps.check(generated, tmp_path / "patches", {})
    assert len(problems) == 3, problems
    assert any("bare.md carries no stamp" in p for p in problems)
    stale = next(p for p in problems if "stale.md" in p)
    assert "0123456789ab (4 patches)" in stale and current["series_id"] in stale
    assert stale.endswith("Regenerate it with: run the GPU bench")
    # Listed as historical (a file, or a directory/), a stale input passes; a current one may not be listed.
    problems = stamps.check(generated, tmp_path / "patches", {"stale.md": "GPU", "runs/": "GPU", "fresh.md": "x"})
    assert len(problems) == 2 and any("fresh.md matches the current series" in p for p in problems)
    assert any("bare.md" in p for p in problems)


def test_generated_inputs_carry_the_current_series_stamp():
    """The committed inputs: every one stamped, and stale ones only where conf.py labels them."""
    conf = {"__file__": str(DOCS / "conf.py")}
    exec(compile((DOCS / "conf.py").read_text(encoding="utf-8"), str(DOCS / "conf.py"), "exec"), conf)
    problems = stamps.check(DOCS / "_generated", ROOT / "patches", conf["generated_historical"])
    assert not problems, "\n".join(problems)


def test_bisect_record_proves_every_prefix_of_the_series():
    """CI does not run tox -e bisect: its record stands for it, so it must be of the current series (the stamp
    check above) and hold a passing row for every prefix scripts/prove-series.sh proves."""
    record = DOCS / "_generated" / "bisect-v0.19.2.md"
    assert record.is_file(), "no bisect record: run `tox -e bisect` (it writes docs/_generated/bisect-v0.19.2.md)"
    series = (ROOT / "patches" / "v0.19.2" / "series").read_text().split()
    prefixes = range(1, sum("-tests-" not in name for name in series))
    rows = {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| .*? \| (\w+) \| .* \| \d+ \|$", record.read_text(), re.M)}
    assert sorted(rows) == list(prefixes), f"{record.name} proves prefixes {sorted(rows)}, the series has {list(prefixes)}"
    assert set(rows.values()) == {"ok"}, f"{record.name}: prefixes not proven: {[n for n, r in rows.items() if r != 'ok']}"


# --------------------------------------------------------------------------- length and numbers of the documents

README = ROOT / "README.md"
README_MAX_WORDS = 1500
RFC_BODY_MAX_WORDS, RFC_TOTAL_MAX_WORDS = 5000, 12000
# The pages whose numbers this project writes by hand: every figure in them must come from a generated file.
FIGURE_DOCS = [README, RFC, DOCS / "index.md", DOCS / "test-matrix.md", *sorted((DOCS / "guide").glob("*.md"))]
GENERATED = DOCS / "_generated"


def _wordcount():
    spec = importlib.util.spec_from_file_location("wordcount", ROOT / "rfc" / "wordcount.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rfc_within_its_word_limits():
    """rfc/wordcount.py's prose count: the body (up to the first appendix) and the whole file."""
    wordcount = _wordcount()
    body, appendices = wordcount.split(RFC.read_text(encoding="utf-8"))
    body_words, total = wordcount.words(body), wordcount.words(body) + wordcount.words(appendices)
    assert body_words <= RFC_BODY_MAX_WORDS, f"the RFC's body has {body_words} words (limit {RFC_BODY_MAX_WORDS})"
    assert total <= RFC_TOTAL_MAX_WORDS, f"the RFC has {total} words in all (limit {RFC_TOTAL_MAX_WORDS})"


def test_readme_within_its_word_limit():
    words = len(README.read_text(encoding="utf-8").split())  # as `wc -w` counts
    assert words <= README_MAX_WORDS, f"README.md has {words} words (limit {README_MAX_WORDS})"


def _prose_blocks(path):
    """(first line, text) of each paragraph, list item or table row of a Markdown file, with code
    (fenced blocks but {invariant} bodies, which are prose; inline code but series ids) removed."""
    blocks, current, start, fence = [], [], 0, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opening = re.match(r"^(`{3,})(\S*)", line)
        if fence is None and opening:
            fence = opening.group(1) if opening.group(2) != "{invariant}" else opening.group(1) + "prose"
            continue
        if fence is not None:
            if line.strip() == fence.replace("prose", ""):
                fence = None
                continue
            if not fence.endswith("prose") or line.startswith(":"):
                continue
        starts_new = not line.strip() or re.match(r"^\s*([-*] |\d+\. |\|)", line)
        if starts_new and current:
            blocks.append((start, " ".join(current)))
            current = []
        if line.strip():
            if not current:
                start = number
            # inline code is not prose, but a series id in it names the revision a count refers to
            current.append(re.sub(r"`([^`]*)`", lambda m: m.group(1) if re.fullmatch(r"[0-9a-f]{12}", m.group(1))
                                  else " ", line))
    if current:
        blocks.append((start, " ".join(current)))
    return blocks


# A measured figure: a number with a unit, or a count of tests or scenarios. Versions, dates in
# links, line numbers and invariant ids are not figures.
FIGURE = re.compile(r"(?<![\w.])(?!0\d)(\d[\d,]*(?:\.\d+)?)(?:\s?(?:GiB|MiB|GB|MB|ms|s|%|×|bytes)\b|"
                    r"(?= (?:of \d[\d,]* )?(?:scenarios?|tests?|passed|failed|skipped|xfail)))")
SOURCE = re.compile(r"<!-- figures: ([^>]+?) -->")


def _matrix_numbers(data):
    """The counts a page may quote from a test matrix: scenarios in all, and per pair of outcomes
    (pristine, patched), e.g. failed on the release and passed with the series."""
    def outcome(value):
        return value["outcome"] if isinstance(value, dict) else value

    first, last = data["columns"][0]["key"], data["columns"][-1]["key"]
    pairs = {}
    for scenario in data["scenarios"]:
        key = (outcome(scenario["results"][first]), outcome(scenario["results"][last]))
        pairs[key] = pairs.get(key, 0) + 1
    return {str(len(data["scenarios"]))} | {str(n) for n in pairs.values()}


def _source_numbers(name):
    path = GENERATED / name
    assert path.is_file(), f"figures are said to come from docs/_generated/{name}, which does not exist"
    text = path.read_text(encoding="utf-8")
    numbers = set(re.findall(r"\d[\d,]*(?:\.\d+)?", text))
    if path.suffix == ".json":
        numbers |= _matrix_numbers(json.loads(text))
    return numbers


def test_every_figure_comes_from_a_generated_file():
    """A paragraph, list item or table row that quotes a measured figure names the generated
    file(s) it comes from in a comment, <!-- figures: test-matrix.json -->, and every figure in it
    is a number of that file (for a test matrix, also its counts of scenarios per outcome): a figure
    typed by hand, or left behind when the file was regenerated, fails here."""
    problems = []
    for path in FIGURE_DOCS:
        for line, text in _prose_blocks(path):
            figures = [m.group(1) for m in FIGURE.finditer(SOURCE.sub(" ", text))]
            if not figures:
                continue
            names = [n for m in SOURCE.finditer(text) for n in m.group(1).split()]
            where = f"{os.path.relpath(path, ROOT)}:{line}"
            if not names:
                problems.append(f"{where}: figures {figures} name no generated source (<!-- figures: FILE -->)")
                continue
            known = set().union(*(_source_numbers(n) for n in names))
            stray = [f for f in figures if f not in known]
            if stray:
                problems.append(f"{where}: {stray} are not in {', '.join(names)}")
    assert not problems, "\n".join(problems)


# The cover letters are plain text that maintainers read, so they name no source inline: each one
# that quotes measured figures is listed here with the generated files they come from.
LETTER_SOURCES = {
    "patches/v0.19.2/cover-letter.txt": ["bench-ws1-v0.19.2.md", "bench-pair-ws1-v0.19.2.md", "host-overhead.md",
                                         "no-frozen-overhead-cpu-v0.19.2.md", "no-frozen-overhead-gpu-v0.19.2.md"],
    "patches/v0.19.8/batch-host-time.txt": ["no-frozen-overhead-cpu-v0.19.8.md"],
}


def _cover_letters():
    patches = ROOT / "patches"
    return sorted([*patches.glob("*/cover-letter.txt"), *patches.glob("v0.19.8/batch-*.txt")])


def test_cover_letters_quote_figures_of_their_generated_files():
    """Every measured figure in a cover letter (the series' and each follow-up batch's) is a number of
    the generated files LETTER_SOURCES lists for it; a letter not listed quotes none."""
    problems = []
    for path in _cover_letters():
        name = str(path.relative_to(ROOT))
        known = set().union(*(_source_numbers(n) for n in LETTER_SOURCES.get(name, [])))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stray = [m.group(1) for m in FIGURE.finditer(line) if m.group(1) not in known]
            if stray:
                problems.append(f"{name}:{number}: {stray} " + (
                    f"are not in {', '.join(LETTER_SOURCES[name])}" if name in LETTER_SOURCES else
                    "quoted, but LETTER_SOURCES names no generated file for this letter"))
    assert not problems, "\n".join(problems)


_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four".split())}
_COUNT = re.compile(r"(?<![\w.])(\d+|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True)) +
                    r")[ -](patch(?:es)?|PRs?|pull requests|batch(?:es)?)\b", re.I)


def _batches():
    lines = (ROOT / "patches" / "v0.19.8" / "batches").read_text(encoding="utf-8").splitlines()
    return {parts[0]: parts[1:] for parts in (l.split() for l in lines if l.strip() and not l.startswith("#"))}


def test_counts_of_patches_and_batches_match_patches():
    """"N patches", "N PRs", "N batches" in the documents: a count of batches is the number of
    batches of the follow-up; a count of patches or PRs is the size of the series, or batch, that the
    same sentence names (an earlier revision by the series id a generated input is stamped with, a
    batch by its name, the follow-up where it says v0.19.8 or follow-up, else the v0.19.2 series)."""
    batches = _batches()
    size = {name: len(stamps.series_patches(ROOT / "patches" / name)) for name in ("v0.19.2", "v0.19.8")}
    # an earlier revision, named by the series id of the generated input that measured it
    measured = {stamp["series_id"]: stamp["patches"] for stamp in map(stamps.read, sorted(p for p in GENERATED.rglob("*") if p.suffix in (".md", ".json", ".png")))
                if stamp}
    problems = []
    for path in FIGURE_DOCS:
        for line, text in _prose_blocks(path):
            for sentence in re.split(r"(?<=[.;:])\s", text):
                for match in _COUNT.finditer(sentence):
                    word = match.group(1).lower()
                    count = int(word) if word.isdigit() else _NUMBER_WORDS[word]
                    revisions = [r for r in re.findall(r"\b[0-9a-f]{12}\b", sentence) if r in measured]
                    if match.group(2).lower().startswith("batch"):
                        expected, what = len(batches), "batches"
                    elif revisions:
                        expected, what = measured[revisions[0]], f"the revision {revisions[0]}"
                    else:
                        named = [b for b in batches if b in sentence]
                        if named:
                            expected, what = len(batches[named[0]]), f"the batch {named[0]}"
                        elif re.search(r"v0\.19\.8|follow-up", sentence):
                            expected, what = size["v0.19.8"], "the v0.19.8 follow-up"
                        else:
                            expected, what = size["v0.19.2"], "the v0.19.2 series"
                    if count != expected:
                        problems.append(f"{os.path.relpath(path, ROOT)}:{line}: '{match.group(0)}', but {what} has {expected}")
    assert not problems, "\n".join(problems)


def test_rfc_patch_table_lists_the_v0192_series():
    """Appendix C's table has one row per patch of patches/v0.19.2/series, in order: a patch added
    to or dropped from the series fails here until the RFC says what it does."""
    text = RFC.read_text(encoding="utf-8")
    appendix = text[text.index("## Appendix C"):text.index("## Appendix D")]
    rows = re.findall(r"(?m)^\| (\d{4}) \|", appendix)
    series = [p.name[:4] for p in stamps.series_patches(ROOT / "patches" / "v0.19.2")]
    assert rows == series, f"the RFC's Appendix C lists patches {rows}; patches/v0.19.2/series has {series}"


def test_figure_checks_catch_stale_and_unsourced_figures(tmp_path, monkeypatch):
    """The two checks above fail on what they are meant to catch."""
    page = tmp_path / "page.md"
    monkeypatch.setattr(sys.modules[__name__], "FIGURE_DOCS", [page])
    page.write_text("It all-gathers 1.768 GiB per step.\n")
    with pytest.raises(AssertionError, match="name no generated source"):
        test_every_figure_comes_from_a_generated_file()
    page.write_text("It all-gathers 9.999 GiB per step. <!-- figures: bench.md -->\n")
    with pytest.raises(AssertionError, match="9.999"):
        test_every_figure_comes_from_a_generated_file()
    page.write_text("The follow-up has twelve patches.\n")
    with pytest.raises(AssertionError, match="twelve patches"):
        test_counts_of_patches_and_batches_match_patches()


# --------------------------------------------------------------------------- troubleshooting page


def _apply_messages():
    text = (ROOT / "scripts" / "apply.sh").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r'die "\$E_[A-Z]+" "(.*)"', text)}


def test_troubleshooting_quotes_every_apply_message_exactly():
    script = ROOT / "scripts" / "apply.sh"
    if not script.exists():
        pytest.skip("scripts/apply.sh is not in this checkout")
    in_script = _apply_messages()
    assert in_script, "no die messages found in scripts/apply.sh: has its error helper been renamed?"
    page = (DOCS / "guide" / "troubleshooting.md").read_text(encoding="utf-8")
    on_page = {m.group(1) for m in re.finditer(r"^apply\.sh: error: (.*)$", page, re.M)}
    missing = sorted(in_script - on_page)
    stale = sorted(on_page - in_script)
    assert not missing, "docs/guide/troubleshooting.md lacks these apply.sh messages:\n" + "\n".join(missing)
    assert not stale, "docs/guide/troubleshooting.md quotes messages apply.sh no longer has:\n" + "\n".join(stale)


# A run of adjacent string literals (implicit concatenation, one per line) starting "ZeRO-3 ":
# how the series writes every message it prints or raises.
_LITERAL = r'f?"(?:[^"\\\n]|\\.)*"'
_MESSAGE = re.compile(r'f?"ZeRO-3 (?:[^"\\\n]|\\.)*"(?:\s*' + _LITERAL + r')*')


def _messages_touched(lines, marker):
    """The messages in one side of a hunk (``lines``: (prefix, text) pairs) that include a line with
    prefix ``marker``: a message whose first line a patch changes may go on in unchanged context."""
    text, touched_at = "", []
    for prefix, line in lines:
        if prefix == marker:
            touched_at.append((len(text), len(text) + len(line)))
        text += line + "\n"
    found = []
    for match in _MESSAGE.finditer(text):
        if any(start < match.end() and match.start() < end for start, end in touched_at):
            found.append("".join(re.findall(r'f?"((?:[^"\\\n]|\\.)*)"', match.group(0))).replace('\\"', '"'))
    return found


def _deepspeed_messages(series_dir):
    """The messages DeepSpeed's source prints once the whole series is applied (not those of its
    tests), each as a regex in which an f-string's {field} matches any text. Patches are read in
    order: a message a later patch changes replaces the earlier one."""
    messages = set()
    for patch in sorted(series_dir.glob("0*.patch")):
        for diff in re.split(r"(?m)^diff --git ", patch.read_text(encoding="utf-8"))[1:]:
            if not diff.startswith("a/deepspeed/"):
                continue
            for hunk in re.split(r"(?m)^@@[^\n]*\n", diff)[1:]:
                lines = [(line[:1], line[1:]) for line in hunk.splitlines() if line[:1] in (" ", "+", "-")]
                messages.difference_update(_messages_touched([l for l in lines if l[0] != "+"], "-"))
                messages.update(_messages_touched([l for l in lines if l[0] != "-"], "+"))
    return {text: re.compile(".+".join(map(re.escape, re.split(r"\{[^{}]*\}", text)))) for text in messages}


def test_troubleshooting_quotes_every_deepspeed_message_exactly():
    """Each "ZeRO-3 ..." line quoted on the page is a message the v0.19.2 series prints, word for
    word (a {field} of the source may read anything, e.g. "<param>"), and each message is quoted."""
    series_dir = ROOT / "patches" / "v0.19.2"
    if not series_dir.is_dir():
        pytest.skip("patches/v0.19.2 is not in this checkout")
    in_source = _deepspeed_messages(series_dir)
    assert in_source, "no 'ZeRO-3 ...' messages found in patches/v0.19.2: has their style changed?"
    page = (DOCS / "guide" / "troubleshooting.md").read_text(encoding="utf-8")
    lines = [re.sub(r"^\w+(?:Error|Warning): ", "", line)  # a quote may start with the exception's class
             for block in re.findall(r"(?ms)^```text\n(.*?)^```", page) for line in block.splitlines()]
    quoted = [line for line in lines if line.startswith("ZeRO-3 ")]
    stale = [q for q in quoted if not any(p.fullmatch(q) for p in in_source.values())]
    missing = sorted(t for t, p in in_source.items() if not any(p.fullmatch(q) for q in quoted))
    assert not stale, "docs/guide/troubleshooting.md quotes messages the series does not print:\n" + "\n".join(stale)
    assert not missing, "docs/guide/troubleshooting.md lacks these messages of the series:\n" + "\n".join(missing)


# --------------------------------------------------------------------------- extension build behaviour


def _mini_project(tmp_path, rfc_body, test_source):
    src = tmp_path / "site" / "docs"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(DOCS / "_ext")!r})
        extensions = ["myst_parser", "invariants"]
        invariants_root = ".."
    '''))
    (src / "index.md").write_text("# Mini\n\n" + rfc_body)
    tests = tmp_path / "site" / "tests"
    tests.mkdir()
    (tests / "test_mini.py").write_text(test_source)
    return src


def _sphinx(src, out, *extra):
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", *extra, str(src), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_build_fails_for_untested_and_unknown_invariants(tmp_path):
    need_sphinx()
    body = "```{invariant} I1 First\nStatement one.\n```\n\n```{invariant} I2 Second\nStatement two.\n```\n"
    src = _mini_project(tmp_path, body,
                        'import pytest\n@pytest.mark.invariants("I1", "I3")\ndef test_a():\n    pass\n')
    run = _sphinx(src, tmp_path / "out")
    assert run.returncode != 0
    assert "invariant I2 has no test" in run.stderr
    assert "claims unknown invariant(s) I3" in run.stderr


def test_build_renders_invariants_with_their_tests(tmp_path):
    need_sphinx()
    body = ("```{invariant} I1 First\nStatement one.\n```\n\nSee {inv}`I1`.\n\n"
            "```{invariant-table}\n```\n")
    src = _mini_project(tmp_path, body, 'import pytest\n@pytest.mark.invariants("I1")\ndef test_a():\n    pass\n')
    run = _sphinx(src, tmp_path / "out")
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert 'id="invariant-i1"' in page
    # test ids may wrap only after "_", "/", "::" (a <wbr> there), never inside a word
    assert '<span class="pre">tests/</span><wbr><span class="pre">test_</span><wbr><span class="pre">mini.py::</span>' in page
    assert re.sub(r"<[^>]+>", "", page).count("tests/test_mini.py::test_a") == 2  # invariant + table
    assert 'href="#invariant-i1"' in page


# --------------------------------------------------------------------------- the real site


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The built HTML site: DOCS_BUILD_DIR if given, else a fresh build of docs/."""
    given = os.environ.get("DOCS_BUILD_DIR")
    if given:
        out = Path(given)
        assert (out / "index.html").is_file(), f"DOCS_BUILD_DIR={given} holds no built site"
        return out
    need_sphinx()
    need(shutil.which("dot"), "Graphviz's dot", "apt-get install -y graphviz")
    out = tmp_path_factory.mktemp("html")
    start = time.monotonic()
    run = _sphinx(DOCS, out, *shlex.split(os.environ.get("DOCS_SPHINX_ARGS", "")))
    elapsed = time.monotonic() - start
    assert run.returncode == 0, f"sphinx-build failed ({elapsed:.0f} s):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    print(f"docs built in {elapsed:.1f} s")
    return out


class _Page(html.parser.HTMLParser):
    """Collects ids, links and embedded resources of one HTML page."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.resources, self.diagrams = set(), [], [], []
        self.title, self._in_h1, self.h1 = "", False, ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key) and (key == "id" or tag == "a"):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        for key in ("src", "data"):
            if tag in ("img", "script", "object", "iframe", "embed", "source") and attrs.get(key):
                self.resources.append(attrs[key])
        if tag == "link" and attrs.get("href") and "stylesheet" in (attrs.get("rel") or ""):
            self.resources.append(attrs["href"])
        if tag in ("svg", "img", "object"):
            classes = (attrs.get("class") or "").split()
            if "graphviz" in classes or tag == "svg":
                self.diagrams.append((tag, attrs.get("data") or attrs.get("src") or ""))
        if tag == "h1":
            self._in_h1 = True

    def handle_endtag(self, tag):
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1 += data


def _parse(text):
    page = _Page()
    page.feed(text)
    return page


def _rfc_title():
    first = RFC.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# "), "the RFC must start with its title"
    return first[2:].strip()


def _expected_diagrams():
    text = RFC.read_text(encoding="utf-8")
    return len(re.findall(r"^```\{(graphviz|sequence)\}", text, re.M))


def test_rfc_page_in_headless_chromium(site, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    need(browser, "Headless Chromium", "apt-get install -y chromium")
    page = site / "rfc.html"
    assert page.is_file(), "the RFC page rfc.html was not built"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", page.as_uri()]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "<html" in run.stdout, f"chromium failed:\n{run.stderr[-3000:]}"
    dom = _parse(run.stdout)

    assert dom.h1.replace("¶", "").strip() == _rfc_title()

    # Every diagram of the RFC is embedded, and the file it points at exists and is an SVG.
    diagrams = [d for d in dom.diagrams if d[0] != "svg"]
    assert len(diagrams) == _expected_diagrams(), diagrams
    for _, ref in diagrams:
        target = (page.parent / urllib.parse.unquote(ref.split("#")[0])).resolve()
        assert target.is_file(), f"diagram {ref} is missing"
        assert "<svg" in target.read_text(encoding="utf-8", errors="replace")[:2000], f"{ref} is not an SVG"

    # The invariants are rendered with anchors, each followed by the tests that claim it.
    declared = re.findall(r"^```\{invariant\} (I\d+)", RFC.read_text(encoding="utf-8"), re.M)
    assert declared, "the RFC declares no invariant"
    for inv in declared:
        assert f"invariant-{inv.lower()}" in dom.ids
    assert "no test yet" not in run.stdout


# Pages with this project's own styling (invariants, the test matrix, generated tables, diagrams),
# and the guide's pages (wide option tables, long quoted messages).
RENDERED_PAGES = ["rfc.html", "test-matrix.html", "index.html", "generated-inputs.html", "guide/quickstart.html",
                  "guide/apply.html", "guide/cherry-pick.html", "guide/forks.html", "guide/troubleshooting.html"]
THEMES = ["light", "dark"]  # furo's data-theme values; "auto" follows the system into one of them
# (name, CSS px): a desktop, and a phone. The page is loaded in an iframe of that width, since
# headless Chromium does not open a window narrower than 500 px.
WIDTHS = [("desktop", 1280), ("phone", 390)]
RENDER_CHECK = Path(__file__).with_name("docs_render_check.js")
_FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="{src}" style="border:0;width:{width}px;height:900px"></iframe>
<script>
function copy() {{  // the measured page writes #render-result; poll until it is there
  const doc = document.querySelector("iframe").contentDocument;
  const result = doc && doc.getElementById("render-result");
  if (!result) {{ setTimeout(copy, 20); return; }}
  const pre = document.createElement("pre"); pre.id = "render-check"; pre.textContent = result.textContent;
  document.body.appendChild(pre);
}}
copy();</script></body></html>"""


def _measure(browser, page, theme, width, profile):
    """Loads a copy of page (beside it, so relative links resolve) with docs_render_check.js, in an
    iframe `width` CSS px wide, and returns what it measured."""
    probe = page.with_name(f"_render_check_{theme}_{page.name}")
    frame = page.with_name(f"_render_frame_{theme}_{page.name}")
    text = page.read_text(encoding="utf-8")
    script = f"<script>const THEME = {json.dumps(theme)};\n{RENDER_CHECK.read_text(encoding='utf-8')}</script>"
    probe.write_text(text.replace("</body>", script + "</body>", 1), encoding="utf-8")
    frame.write_text(_FRAME.format(src=probe.name, width=width), encoding="utf-8")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--allow-file-access-from-files", "--hide-scrollbars", f"--window-size={width + 40},1000",
           "--virtual-time-budget=15000", f"--user-data-dir={profile}", "--dump-dom", frame.as_uri()]
    try:
        for _ in range(3):  # the load event occasionally misses chromium's dump; it is measured again
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            found = re.findall(r'<pre id="render-check">(.*?)</pre>', run.stdout, re.S)
            if found:
                return json.loads(html.unescape(found[-1]))
    finally:
        probe.unlink()
        frame.unlink()
    pytest.fail(f"chromium did not measure {page.name} ({theme}, {width} px):\n{run.stderr[-2000:]}")


@pytest.mark.parametrize("width", [w for w, _ in WIDTHS])
@pytest.mark.parametrize("theme", THEMES)
def test_rendered_pages(site, tmp_path_factory, theme, width):
    """What a reader sees, measured in Chromium in both furo themes at a desktop and a phone width:
    no table or figure is wider than the column unless it scrolls in a box with a visible cue (edge
    shadows), the page never scrolls sideways, the text this project colours has a WCAG contrast of
    at least 4.5:1 against its computed background, and diagram labels are drawn at 9 px or more."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    need(browser, "Headless Chromium", "apt-get install -y chromium")
    # A copy: the probe pages are written beside the measured ones, never into the build itself.
    copy = tmp_path_factory.mktemp("site") / "html"
    shutil.copytree(site, copy)
    size = dict(WIDTHS)[width]
    problems, counts = [], {}
    for name in RENDERED_PAGES:
        result = _measure(browser, copy / name, theme, size, tmp_path_factory.mktemp("chromium"))
        assert result["theme"] == theme and result["width"] == size, result
        counts[name] = result["counts"]
        problems += [f"{name}: {p}" for p in result["problems"]]
    print(f"{theme} {width}: {counts}")
    # The checks must have had something to check: the RFC's diagrams and the matrix's outcomes.
    assert counts["rfc.html"]["diagrams"] == _expected_diagrams()
    assert counts["test-matrix.html"]["contrast"] > 0
    assert not problems, f"rendering problems ({theme}, {width}, {size} px):\n" + "\n".join(problems)


def test_stale_figure_notes_are_sentences_that_say_how_far_behind(site):
    """The note above an input measured on an earlier revision ends with a full stop and gives the
    series' size then and now, read from patches/ at build time, so that its reason cannot stop at
    some older revision."""
    notes = []
    for page in _built_pages(site):
        for note in re.findall(r'<p class="stamp-note">(.*?)</p>', page.read_text(encoding="utf-8"), re.S):
            notes.append((page.name, html.unescape(re.sub(r"<[^>]+>", "", note)).strip()))
    assert notes, "no page shows a stamp note: the RFC includes inputs measured on earlier revisions"
    counts = {d.name: len(stamps.series_patches(d)) for d in (ROOT / "patches").iterdir() if (d / "series").is_file()}
    for name, text in notes:
        assert text.endswith("."), f"{name}: the stamp note does not end with a full stop: {text[-80:]!r}"
        assert not text.endswith("..") and ".. " not in text, f"{name}: a doubled full stop in {text!r}"
        match = re.search(r"was measured on the (\S+) series at \w+, (\d+) patches .*the series is now \w+, (\d+) patches",
                          text)
        assert match, f"{name}: the stamp note does not give the series' size then and now: {text!r}"
        assert int(match.group(3)) == counts[match.group(1)], (name, text)


def _built_pages(site):
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)


def test_no_broken_internal_links(site):
    pages = {p.resolve(): _parse(p.read_text(encoding="utf-8")) for p in _built_pages(site)}
    broken = []
    for path, page in pages.items():
        for href in page.links:
            parts = urllib.parse.urlsplit(href)
            if parts.scheme in ("http", "https", "mailto") or href.startswith("//"):
                continue
            if parts.scheme:
                broken.append(f"{path.name}: unexpected link scheme {href}")
                continue
            target = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site.resolve())}: {href} (no such file)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target.read_text(encoding="utf-8")).ids
                if urllib.parse.unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site.resolve())}: {href} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_pages_load_nothing_from_the_network(site):
    remote = []
    for path in _built_pages(site):
        for ref in _parse(path.read_text(encoding="utf-8")).resources:
            if re.match(r"^(https?:)?//", ref):
                remote.append(f"{path.name}: {ref}")
    assert not remote, "pages load remote resources (the site must work offline):\n" + "\n".join(remote)
