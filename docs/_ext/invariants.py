"""Sphinx extension: RFC invariants, the tests that check them, and a build-time check.

Markup (MyST)::

    ```{invariant} I1 Quiescence
    After every successful backward graph task ...
    ```

declares invariant ``I1`` titled "Quiescence" with the body as its statement, renders
it with the anchor ``#invariant-i1`` and, below the statement, the list of tests
that claim it.  ``{inv}`I1``` links to a declared invariant from any page, and
``{invariant-table}`` renders one row per invariant with its tests.

Tests claim invariants with ``@pytest.mark.invariants("I1", ...)`` (see
invariant_scan.py, which reads tests/**/*.py and the test files added by
patches/[0-9]*.patch).  After all pages are read the extension reports, as Sphinx
errors (so ``sphinx-build -W`` fails):

* a declared invariant that no test claims;
* a test that claims an invariant the RFC does not declare;
* an invariant declared twice, a malformed marker, an unknown ``{inv}`` target.

Config values: ``invariants_root`` (directory that test and patch globs are relative
to; default: the parent of the Sphinx source dir), ``invariants_test_globs``,
``invariants_patch_globs``, ``invariants_require_tests`` (default True; set False
only for drafts).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

sys.path.insert(0, os.path.dirname(__file__))
import invariant_scan  # noqa: E402  (sibling module, importable without Sphinx)

logger = logging.getLogger(__name__)


class invariant_tests(nodes.General, nodes.Element):
    """Placeholder for the list of tests of one invariant; filled when the doc is resolved."""


class invariant_table(nodes.General, nodes.Element):
    """Placeholder for the table of all invariants."""


class invariant_ref(nodes.Inline, nodes.Element):
    """Placeholder for a link to an invariant (the {inv} role)."""


def anchor(inv_id: str) -> str:
    return f"invariant-{inv_id.lower()}"


def _docname(env) -> str:
    current = getattr(env, "current_document", None)  # Sphinx >= 8.2
    return current.docname if current is not None else env.docname


def _declared(env) -> dict:
    if not hasattr(env, "invariants_declared"):
        env.invariants_declared = {}
    return env.invariants_declared


class InvariantDirective(SphinxDirective):
    required_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = {"class": directives.class_option}

    def run(self):
        parts = self.arguments[0].split(None, 1)
        inv_id = parts[0]
        title = parts[1].strip() if len(parts) > 1 else ""
        if not invariant_scan.INVARIANT_ID.match(inv_id):
            logger.error(f"invariant id {inv_id!r} is malformed: expected I<number>, e.g. 'I1 Quiescence'",
                         location=self.get_location())
            return []
        if not self.content:
            logger.error(f"invariant {inv_id} has no statement", location=self.get_location())
        declared = _declared(self.env)
        if inv_id in declared:
            other = declared[inv_id]
            logger.error(f"invariant {inv_id} is declared twice (first in {other['docname']}:{other['lineno']})",
                         location=self.get_location())
            return []
        declared[inv_id] = {"docname": _docname(self.env), "title": title, "lineno": self.lineno,
                           # source file and line, right even when the RFC is pulled in by {include}
                           "location": self.get_location()}

        box = nodes.admonition(classes=["invariant"] + self.options.get("class", []))
        box["ids"].append(anchor(inv_id))
        heading = f"{inv_id} {title}".strip()
        title_node = nodes.title(heading, "")
        title_node += nodes.strong(inv_id, inv_id)
        if title:
            title_node += nodes.Text(" " + title)
        box += title_node
        self.state.nested_parse(self.content, self.content_offset, box)
        tests = invariant_tests(invariant=inv_id)
        box += tests
        return [box]


class InvariantTableDirective(SphinxDirective):
    has_content = False

    def run(self):
        self.env.note_dependency(__file__)
        node = invariant_table()
        _table_docs(self.env).add(_docname(self.env))
        return [node]


def _table_docs(env) -> set:
    if not hasattr(env, "invariants_table_docs"):
        env.invariants_table_docs = set()
    return env.invariants_table_docs


class InvRole(SphinxRole):
    """{inv}`I3` links to invariant I3; the link text is the id."""

    def run(self):
        target = self.text.strip()
        node = invariant_ref(invariant=target, docname=_docname(self.env), lineno=self.lineno)
        node += nodes.Text(target)
        return [node], []


# --------------------------------------------------------------------------- env hooks


def purge(app, env, docname):
    declared = _declared(env)
    for inv_id in [k for k, v in declared.items() if v["docname"] == docname]:
        del declared[inv_id]
    _table_docs(env).discard(docname)


def merge(app, env, docnames, other):
    declared = _declared(env)
    for inv_id, info in _declared(other).items():
        if info["docname"] in docnames:
            declared[inv_id] = info
    _table_docs(env).update(d for d in _table_docs(other) if d in docnames)


def outdated(app, env, added, changed, removed):
    # Test lists are not part of any source page, so pages that show them are rebuilt every time.
    docs = {info["docname"] for info in _declared(env).values()} | _table_docs(env)
    return sorted(d for d in docs if d not in removed)


def scan(app):
    cfg = app.config
    root = Path(cfg.invariants_root) if cfg.invariants_root else Path(app.srcdir).parent
    if not root.is_absolute():
        root = (Path(app.confdir) / root).resolve()
    app.invariants_scan = invariant_scan.scan_tree(root, cfg.invariants_test_globs, cfg.invariants_patch_globs)
    app.invariants_root_dir = root


def check_consistency(app, env):
    declared = _declared(env)
    result = app.invariants_scan
    problems = invariant_scan.check(sorted(declared, key=invariant_scan._id_key), result,
                                    require_tests=app.config.invariants_require_tests)
    for problem in problems:
        location = None
        if problem.origin:
            location = f"{app.invariants_root_dir / problem.origin}:{problem.lineno}"
        elif problem.message.startswith("invariant "):
            inv_id = problem.message.split()[1]
            info = declared.get(inv_id)
            if info:
                location = info.get("location") or (info["docname"], info["lineno"])
        logger.error(problem.message, location=location, type="invariants")
    if not declared and (app.config.invariants_require_tests or result.claims):
        logger.error("no {invariant} directive found: the RFC must declare its invariants", type="invariants")


# --------------------------------------------------------------------------- rendering


def breakable_literal(text: str) -> nodes.literal:
    """``text`` as inline code that a narrow column may wrap after "_", "/", "::" or "[", not
    inside a word: a test id such as tests/test_x.py::test_a_b[c] has no spaces to break at."""
    literal = nodes.literal(text, "")
    for piece in re.split(r"(?<=[_/\[])|(?<=::)", text):
        if not piece:
            continue
        if len(literal):
            literal += nodes.raw("", "<wbr>", format="html")
        literal += nodes.Text(piece)
    return literal


def _test_items(claims):
    items = nodes.bullet_list(classes=["invariant-tests"])
    for claim in claims:
        para = nodes.paragraph()
        para += breakable_literal(claim.test)
        if claim.origin != claim.test.split("::", 1)[0]:
            # the test lives in a file that a patch adds to DeepSpeed
            para += nodes.Text(f" (added by {claim.origin})")
        items += nodes.list_item("", para)
    return items


def _link(app, fromdocname, inv_id, text=None):
    info = _declared(app.env).get(inv_id)
    text = text or inv_id
    if info is None:
        return None
    uri = app.builder.get_relative_uri(fromdocname, info["docname"]) + "#" + anchor(inv_id)
    ref = nodes.reference("", "", internal=True, refuri=uri, reftitle=f"{inv_id} {info['title']}".strip())
    ref += nodes.Text(text)
    return ref


def _count(claims) -> str:
    return f"{len(claims)} test" + ("" if len(claims) == 1 else "s")


def _listing_link(app, fromdocname, listing, inv_id, text):
    uri = app.builder.get_relative_uri(fromdocname, listing) + "#" + listing_anchor(inv_id)
    ref = nodes.reference("", "", internal=True, refuri=uri, reftitle=f"the tests that claim {inv_id}")
    ref += nodes.Text(text)
    return ref


def listing_anchor(inv_id: str) -> str:
    return f"invariant-tests-{inv_id.lower()}"


def resolve(app, doctree, fromdocname):
    by_inv = app.invariants_scan.by_invariant()
    declared = _declared(app.env)
    # invariants_tests_page: the one page whose {invariant-table} lists every test (empty: each
    # invariant and each table lists them in full).
    listing = app.config.invariants_tests_page
    if listing and listing not in _table_docs(app.env):
        logger.error(f"invariants_tests_page = {listing!r}, but that page has no {{invariant-table}}",
                     type="invariants")
        listing = ""

    for node in list(doctree.findall(invariant_tests)):
        claims = by_inv.get(node["invariant"], [])
        container = nodes.container(classes=["invariant-tests-block"])
        label = nodes.paragraph()
        label += nodes.strong("Checked by:", "Checked by:")
        if not claims:
            label += nodes.Text(" no test yet.")
            container += label
        elif listing and listing != fromdocname:
            # The tests are listed once, in the table on the listing page; here a count and a link.
            label += nodes.Text(" ")
            label += _listing_link(app, fromdocname, listing, node["invariant"], _count(claims))
            label += nodes.Text(".")
            container += label
        else:
            container += label
            container += _test_items(claims)
        node.replace_self(container)

    for node in list(doctree.findall(invariant_ref)):
        inv_id = node["invariant"]
        ref = _link(app, fromdocname, inv_id)
        if ref is None:
            logger.error(f"{{inv}} names unknown invariant {inv_id!r}", location=(node["docname"], node["lineno"]),
                         type="invariants")
            node.replace_self(nodes.literal(inv_id, inv_id))
        else:
            node.replace_self(ref)

    for node in list(doctree.findall(invariant_table)):
        table = nodes.table(classes=["invariant-table"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (12, 28, 60):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        row = nodes.row()
        for title in ("Invariant", "Name", "Tests that claim it"):
            row += nodes.entry("", nodes.paragraph(text=title))
        head += row
        body = nodes.tbody()
        group += body
        for inv_id in sorted(declared, key=invariant_scan._id_key):
            row = nodes.row()
            cell = nodes.entry()
            para = nodes.paragraph()
            para += _link(app, fromdocname, inv_id)
            cell += para
            row += cell
            row += nodes.entry("", nodes.paragraph(text=declared[inv_id]["title"]))
            claims = by_inv.get(inv_id, [])
            cell = nodes.entry()
            if not claims:
                cell += nodes.paragraph(text="none")
            elif listing and listing != fromdocname:
                cell += nodes.paragraph("", "", _listing_link(app, fromdocname, listing, inv_id, _count(claims)))
            else:
                row["ids"].append(listing_anchor(inv_id))
                cell += _test_items(claims)
            row += cell
            body += row
        node.replace_self(table)


def setup(app):
    app.add_config_value("invariants_root", "", "env")
    app.add_config_value("invariants_test_globs", ["tests/**/*.py"], "env")
    app.add_config_value("invariants_patch_globs", ["patches/[0-9]*.patch"], "env")
    app.add_config_value("invariants_require_tests", True, "env")
    app.add_config_value("invariants_tests_page", "", "env")
    app.add_node(invariant_tests)
    app.add_node(invariant_table)
    app.add_node(invariant_ref)
    app.add_directive("invariant", InvariantDirective)
    app.add_directive("invariant-table", InvariantTableDirective)
    app.add_role("inv", InvRole())
    app.connect("builder-inited", scan)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("env-get-outdated", outdated)
    app.connect("env-check-consistency", check_consistency)
    app.connect("doctree-resolved", resolve)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
