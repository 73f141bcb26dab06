"""Sphinx extension: pages built from generated inputs, never from hand-typed numbers.

Measured results (benchmarks, bookkeeping counters, the test matrix) are produced by
the project's scripts into ``docs/_generated/`` (config ``generated_dir``).  Pages pull
them in with two directives; a missing or malformed input is a Sphinx error, so
``sphinx-build -W`` fails and names the file and what produces it.

``{generated} NAME``
    Inserts ``_generated/NAME``: a ``.md`` file is parsed as MyST Markdown in place;
    a ``.png``/``.svg`` file becomes an image (options ``:alt:``, ``:caption:``).
    ``:producer:`` says what writes the file, for the error message.

``{test-matrix} [NAME]``
    Renders ``_generated/NAME`` (default ``test-matrix.json``), whose format is
    documented in docs/_generated/README.md and checked by :func:`load_matrix`.

``{invariants-by-batch} NAME``
    Counts, per invariant, the scenarios of the v0.19.8 matrix NAME that claim it, by the
    follow-up batch that makes them pass (:func:`invariants_by_batch`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import stamps  # sibling module (docs/_ext is on sys.path: conf.py)

OUTCOMES = {
    # outcome -> (text shown, css class)
    "passed": ("pass", "outcome-pass"),
    "failed": ("FAIL", "outcome-fail"),
    "error": ("ERROR", "outcome-fail"),
    "xfailed": ("xfail", "outcome-xfail"),
    "xpassed": ("XPASS", "outcome-fail"),
    "skipped": ("skip", "outcome-skip"),
    "not-run": ("not run", "outcome-skip"),
}
SCHEMA = "zero3-test-matrix/1"


class MatrixError(ValueError):
    pass


def load_matrix(text: str) -> Dict[str, Any]:
    """Parse and validate a test-matrix file; raise MatrixError naming the first problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MatrixError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MatrixError("the top level must be an object")
    if data.get("schema") != SCHEMA:
        raise MatrixError(f"\"schema\" must be \"{SCHEMA}\", got {data.get('schema')!r}")
    columns = data.get("columns")
    if not isinstance(columns, list) or not columns:
        raise MatrixError("\"columns\" must be a non-empty list of {\"key\", \"title\"} objects")
    keys = []
    for i, col in enumerate(columns):
        if not isinstance(col, dict) or not isinstance(col.get("key"), str) or not isinstance(col.get("title"), str):
            raise MatrixError(f"columns[{i}] must be an object with string \"key\" and \"title\"")
        keys.append(col["key"])
    if len(set(keys)) != len(keys):
        raise MatrixError("column keys must be unique")
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, list) or not scenarios:
        raise MatrixError("\"scenarios\" must be a non-empty list")
    for i, sc in enumerate(scenarios):
        where = f"scenarios[{i}]"
        if not isinstance(sc, dict):
            raise MatrixError(f"{where} must be an object")
        for key in ("id", "title", "checks"):
            if not isinstance(sc.get(key), str) or not sc[key].strip():
                raise MatrixError(f"{where}.{key} must be a non-empty string")
        invs = sc.get("invariants", [])
        if not isinstance(invs, list) or not all(isinstance(x, str) for x in invs):
            raise MatrixError(f"{where}.invariants must be a list of ids such as \"I1\"")
        results = sc.get("results")
        if not isinstance(results, dict):
            raise MatrixError(f"{where}.results must be an object keyed by column key")
        for key in keys:
            if key not in results:
                raise MatrixError(f"{where} ({sc['id']}) has no result for column {key!r}")
        for key, value in results.items():
            if key not in keys:
                raise MatrixError(f"{where}.results has unknown column {key!r}")
            outcome = value.get("outcome") if isinstance(value, dict) else value
            if outcome not in OUTCOMES:
                raise MatrixError(f"{where}.results.{key}: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
            if isinstance(value, dict) and not isinstance(value.get("detail", ""), str):
                raise MatrixError(f"{where}.results.{key}.detail must be a string")
    return data


def read_series(patch_dir: Path) -> List[Dict[str, Any]]:
    """The patches listed in ``patch_dir/series``: file, subject and the files each one touches."""
    series = patch_dir / "series"
    if not series.is_file():
        raise MatrixError(f"{series} is missing")
    patches = []
    for raw in series.read_text(encoding="utf-8").splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = patch_dir / name
        if not path.is_file():
            raise MatrixError(f"{series} lists {name}, which does not exist")
        subject, files, in_subject = "", [], False
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Subject:") and not subject:
                subject, in_subject = line[len("Subject:"):].strip(), True
                continue
            if in_subject:
                if line.startswith((" ", "\t")):  # a folded header line continues the subject
                    subject += " " + line.strip()
                    continue
                in_subject = False
            if line.startswith("diff --git "):
                target = line.rsplit(" b/", 1)[-1]
                files.append({"path": target, "new": False})
            elif line.startswith("new file mode") and files:
                files[-1]["new"] = True
        # format-patch subjects start with "[PATCH n/m] "
        if subject.startswith("["):
            subject = subject.split("]", 1)[-1].strip()
        patches.append({"file": name, "subject": subject, "files": files})
    if not patches:
        raise MatrixError(f"{series} lists no patch")
    return patches


def read_batches(path: Path) -> Dict[int, str]:
    """patches/v0.19.8/batches: {patch number: batch name}, batches in merge order."""
    if not path.is_file():
        raise MatrixError(f"{path} is missing")
    owner = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        parts = raw.split("#", 1)[0].split()
        for number in parts[1:]:
            owner[int(number)] = parts[0]
    if not owner:
        raise MatrixError(f"{path} lists no batch")
    return owner


def invariants_by_batch(data: Dict[str, Any], expectation, batch_of: Dict[int, str]):
    """Per invariant, how many scenarios that claim it fail on the release (the matrix's first
    column) and pass with the follow-up (its last), by the batch of the patch each one needs
    (``expectation(test name)``: a patch number, 0 for a guard); and how many pass on both
    (guards) or fail on both. Returns ({invariant: {column: count}}, batch names in merge order)."""
    first, last = data["columns"][0]["key"], data["columns"][-1]["key"]
    table: Dict[str, Dict[str, int]] = {}
    for sc in data["scenarios"]:
        outcomes = (cell(sc["results"][first])["outcome"], cell(sc["results"][last])["outcome"])
        if outcomes == ("failed", "passed"):
            need = expectation(sc["id"].rsplit("::", 1)[-1])
            if not isinstance(need, int) or need not in batch_of:
                raise MatrixError(f"{sc['id']} fails on {first} and passes with {last}, but tests/bases.py "
                                  f"names no patch of a batch for it ({need!r})")
            column = batch_of[need]
        elif outcomes == ("passed", "passed"):
            column = "guard"
        elif outcomes == ("failed", "failed"):
            column = "open"
        else:
            continue
        for inv in sc.get("invariants", []):
            row = table.setdefault(inv, {})
            row[column] = row.get(column, 0) + 1
    return table, list(dict.fromkeys(batch_of.values()))


def cell(value) -> Dict[str, str]:
    """Normalise a result (a bare outcome string or {outcome, detail})."""
    if isinstance(value, str):
        return {"outcome": value, "detail": ""}
    return {"outcome": value["outcome"], "detail": value.get("detail", "")}


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import directives
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective

    logger = logging.getLogger(__name__)

    def generated_path(env, name: str) -> Path:
        base = Path(env.config.generated_dir)
        if not base.is_absolute():
            base = Path(env.srcdir) / base
        return base / name

    def missing(directive, path: Path, producer: str):
        rel = os.path.relpath(path, Path(directive.env.srcdir).parent)
        how = f" It is produced by {producer}." if producer else ""
        logger.error(f"generated input {rel} is missing.{how} See docs/_generated/README.md.",
                     location=directive.get_location())
        warning = nodes.admonition(classes=["error"])
        warning += nodes.title(text="Missing generated input")
        warning += nodes.paragraph(text=f"{rel} was not found when this page was built.{how}")
        return [warning]

    def patches_root(env) -> Path:
        base = Path(env.config.patches_dir)
        if not base.is_absolute():
            base = (Path(env.srcdir) / base).resolve()
        return base.parent

    def historical_note(env, path: Path):
        """A visible note above an input that generated_historical keeps on an older revision."""
        base = generated_path(env, "")
        rel = path.relative_to(base).as_posix()
        why = stamps.historical_reason(env.config.generated_historical, rel)
        if why is None:
            return []
        stamp = stamps.read(path) or {}
        series_dir = patches_root(env) / stamp.get("series", "")
        try:
            now, now_patches = stamps.series_id(series_dir), len(stamps.series_patches(series_dir))
        except stamps.StampError:
            now, now_patches = "unknown", "?"
        para = nodes.paragraph(classes=["stamp-note"])
        para += nodes.strong(text="Measured on an earlier revision. ")
        para += nodes.Text(f"{rel} was measured on the {stamp.get('series')} series at ")
        para += nodes.literal(text=stamp.get("series_id", "?"))
        para += nodes.Text(f", {stamp.get('patches')} patches (DeepSpeed {stamp.get('deepspeed')}; trees: "
                           f"{', '.join(stamp.get('trees', []))}); the series is now ")
        para += nodes.literal(text=now)
        para += nodes.Text(f", {now_patches} patches, and these figures were not measured on it. {why.rstrip('.')}. "
                           "Regenerate with: ")
        para += nodes.literal(text=stamp.get("command", "?"))
        para += nodes.Text(".")
        return [para]

    def check_stamps(app):
        """Every generated input is stamped and measured the current series (or is listed, with
        its reason, in generated_historical and labelled on its page)."""
        config = app.config
        base = Path(config.generated_dir)
        if not base.is_absolute():
            base = Path(app.srcdir) / base
        patches = Path(config.patches_dir)
        if not patches.is_absolute():
            patches = (Path(app.srcdir) / patches).resolve()
        for problem in stamps.check(base, patches.parent, config.generated_historical):
            logger.error(problem, type="generated", subtype="stamp")

    class GeneratedDirective(SphinxDirective):
        required_arguments = 1
        option_spec = {
            "alt": directives.unchanged,
            "caption": directives.unchanged,
            "producer": directives.unchanged,
            "width": directives.unchanged,
        }

        def run(self):
            name = self.arguments[0]
            path = generated_path(self.env, name)
            producer = self.options.get("producer", "")
            self.env.note_dependency(str(path))
            if not path.is_file():
                return missing(self, path, producer)
            suffix = path.suffix.lower()
            note = historical_note(self.env, path)
            if suffix == ".md":
                text = stamps.strip_markdown(path.read_text(encoding="utf-8"))
                if not text.strip():
                    logger.error(f"generated input {path} is empty", location=self.get_location())
                    return []
                box = nodes.container(classes=["generated"])
                self.state.nested_parse(StringList(text.splitlines(), source=str(path)), 0, box)
                return note + [box]
            if suffix in (".png", ".svg"):
                docdir = Path(self.env.doc2path(self.env.current_document.docname)).parent
                image = nodes.image(uri=os.path.relpath(path, docdir).replace(os.sep, "/"),
                                    alt=self.options.get("alt", name))
                if "width" in self.options:
                    image["width"] = self.options["width"]
                if "caption" in self.options:
                    # a box of its own, which scrolls a chart kept readable on a narrow screen
                    figure = nodes.figure("", nodes.container("", image, classes=["chart-scroll"]))
                    inodes, messages = self.parse_inline(self.options["caption"])
                    figure += nodes.caption(self.options["caption"], "", *inodes)
                    return note + [figure] + messages
                return note + [image]
            logger.error(f"{{generated}} cannot include {name}: only .md, .png and .svg files",
                         location=self.get_location())
            return []

    class TestMatrixDirective(SphinxDirective):
        optional_arguments = 1

        def run(self):
            from invariants import breakable_literal, invariant_ref  # links to the RFC's invariants

            name = self.arguments[0] if self.arguments else "test-matrix.json"
            path = generated_path(self.env, name)
            self.env.note_dependency(str(path))
            if not path.is_file():
                return missing(self, path, "the export of the test results of the pristine and patched runs")
            try:
                data = load_matrix(path.read_text(encoding="utf-8"))
            except MatrixError as exc:
                logger.error(f"{path}: {exc}", location=self.get_location())
                return []
            columns = data["columns"]
            result = []
            meta = [data.get(k) for k in ("environment", "base", "series", "generated") if data.get(k)]
            if meta:
                para = nodes.paragraph(classes=["matrix-meta"])
                para += nodes.Text("; ".join(str(m) for m in meta) + ".")
                result.append(para)
            # The results come right after the scenario's name, so that they are on screen
            # whatever the width: a reader looks for the patched tree's outcome first.
            table = nodes.table(classes=["test-matrix"])
            group = nodes.tgroup(cols=3 + len(columns))
            table += group
            for width in [24] + [11] * len(columns) + [34, 9]:
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            group += head
            row = nodes.row()
            row += nodes.entry("", nodes.paragraph(text="Scenario"))
            for col in columns:
                row += nodes.entry("", nodes.paragraph(text=col["title"]), classes=["matrix-result"])
            for title in ["What it checks", "Invariants"]:
                row += nodes.entry("", nodes.paragraph(text=title))
            head += row
            body = nodes.tbody()
            group += body
            for sc in data["scenarios"]:
                row = nodes.row()
                entry = nodes.entry()
                para = nodes.paragraph()
                para += nodes.strong(text=sc["title"])
                entry += para
                entry += nodes.paragraph("", "", breakable_literal(sc["id"]))
                row += entry
                for col in columns:
                    value = cell(sc["results"][col["key"]])
                    text, css = OUTCOMES[value["outcome"]]
                    entry = nodes.entry(classes=[css])
                    para = nodes.paragraph()
                    para += nodes.inline(text=text, classes=["outcome", css])
                    entry += para
                    if value["detail"]:
                        entry += nodes.paragraph(text=value["detail"], classes=["outcome-detail"])
                    row += entry
                row += nodes.entry("", nodes.paragraph(text=sc["checks"]))
                entry = nodes.entry()
                para = nodes.paragraph()
                for i, inv in enumerate(sc.get("invariants", [])):
                    if i:
                        para += nodes.Text(", ")
                    ref = invariant_ref(invariant=inv, docname=self.env.current_document.docname, lineno=self.lineno)
                    ref += nodes.Text(inv)
                    para += ref
                entry += para
                row += entry
                body += row
            result.append(table)
            return result

    class InvariantsByBatchDirective(SphinxDirective):
        """{invariants-by-batch} NAME: for each invariant, the scenarios of the v0.19.8 test matrix
        NAME that claim it, by the follow-up batch that makes them pass (tests/bases.py says which
        patch each needs, patches/v0.19.8/batches which batch holds that patch)."""
        required_arguments = 1

        def run(self):
            import importlib.util
            from invariants import invariant_ref

            path = generated_path(self.env, self.arguments[0])
            root = Path(self.env.srcdir).parent
            bases_py, batches = root / "tests" / "bases.py", root / "patches" / "v0.19.8" / "batches"
            for dependency in (path, bases_py, batches):
                self.env.note_dependency(str(dependency))
            if not path.is_file():
                return missing(self, path, "the export of the v0.19.8 test results")
            try:
                spec = importlib.util.spec_from_file_location("zero3_bases_for_docs", bases_py)
                bases = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(bases)

                def expectation(name):
                    return bases.V0198.get(name, bases.V0198.get(name.split("[", 1)[0]))

                table, names = invariants_by_batch(load_matrix(path.read_text(encoding="utf-8")), expectation,
                                                   read_batches(batches))
            except (MatrixError, OSError, ImportError) as exc:
                logger.error(f"{{invariants-by-batch}}: {exc}", location=self.get_location())
                return []
            columns = names + ["guard", "open"]
            titles = names + ["pass on both", "fail on both"]
            grid = nodes.table(classes=["invariants-by-batch"])
            group = nodes.tgroup(cols=1 + len(columns))
            grid += group
            for _ in range(1 + len(columns)):
                group += nodes.colspec(colwidth=10)
            head, row = nodes.thead(), nodes.row()
            for title in ["Invariant"] + titles:
                row += nodes.entry("", nodes.paragraph(text=title))
            head += row
            group += head
            body = nodes.tbody()
            for inv in sorted(table, key=lambda i: int(i[1:])):
                row = nodes.row()
                para = nodes.paragraph()
                ref = invariant_ref(invariant=inv, docname=self.env.current_document.docname, lineno=self.lineno)
                ref += nodes.Text(inv)
                para += ref
                row += nodes.entry("", para)
                for column in columns:
                    count = table[inv].get(column, 0)
                    row += nodes.entry("", nodes.paragraph(text=str(count) if count else ""))
                body += row
            group += body
            return [grid]

    class PatchSeriesDirective(SphinxDirective):
        """A table of the patch series, read from patches/series and the patch files."""

        def run(self):
            base = Path(self.env.config.patches_dir)
            if not base.is_absolute():
                base = (Path(self.env.srcdir) / base).resolve()
            self.env.note_dependency(str(base / "series"))
            try:
                patches = read_series(base)
            except MatrixError as exc:
                logger.error(f"patch series: {exc}", location=self.get_location())
                return []
            table = nodes.table(classes=["patch-series"])
            group = nodes.tgroup(cols=3)
            table += group
            for width in (22, 38, 40):
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            row = nodes.row()
            for title in ("Patch file", "Subject", "Files"):
                row += nodes.entry("", nodes.paragraph(text=title))
            head += row
            group += head
            body = nodes.tbody()
            for patch in patches:
                self.env.note_dependency(str(base / patch["file"]))
                row = nodes.row()
                row += nodes.entry("", nodes.paragraph("", "", nodes.literal(text=patch["file"])))
                row += nodes.entry("", nodes.paragraph(text=patch["subject"]))
                entry = nodes.entry()
                for f in patch["files"]:
                    para = nodes.paragraph()
                    para += nodes.literal(text=f["path"])
                    if f["new"]:
                        para += nodes.Text(" (new)")
                    entry += para
                row += entry
                body += row
            group += body
            return [table]

    app.add_config_value("patches_dir", "../patches/v0.19.2", "env")
    app.add_directive("patch-series", PatchSeriesDirective)
    app.add_config_value("generated_dir", "_generated", "env")
    app.add_directive("generated", GeneratedDirective)
    app.add_directive("test-matrix", TestMatrixDirective)
    app.add_directive("invariants-by-batch", InvariantsByBatchDirective)
    # generated_historical: {input path relative to generated_dir (a "dir/" covers a directory):
    # why it stays measured on an older revision}; such inputs are labelled on their page.
    app.add_config_value("generated_historical", {}, "env")
    app.connect("builder-inited", check_stamps)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
