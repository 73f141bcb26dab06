"""The fork maintainer's documents say what the tools do (docs/guide/forks.md, cherry-pick.md, apply.md,
troubleshooting.md, tox.ini's environment list), and the patch dependency graph they quote is the series'.

Each check is a function returning the problems it finds in a text, so that it can be run on an older
revision of a document too (the commit that added it ran them on the documents before the fix)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide"


def recipe_problems(text):
    """Recipes a fork maintainer would follow that fail or lose work."""
    problems = []
    flat = " ".join(text.split())
    if "taken alone" in flat:
        problems.append("says a patch 'can be taken alone' (the dependency graph says which can)")
    code = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    if re.search(r"git am (-3|--3way)", code):
        problems.append("runs git am --3way, which stops in a fork's clone for want of the patches' blobs")
    if re.search(r"git switch -c \S+ v\d", code):
        problems.append("branches from the upstream tag, dropping the fork's own commits")
    for line in text.splitlines():
        if "--notest" in line and "installs none" not in line and "installs nothing" not in line:
            problems.append(f"mentions --notest without saying it installs nothing: {line.strip()}")
    return problems


def extensions_dir_problems(text):
    """Code lines that run DeepSpeed's tests (which JIT-build ops) without a TORCH_EXTENSIONS_DIR of their own."""
    problems = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        exported = False
        for line in block.splitlines():
            exported = exported or line.lstrip().startswith("export TORCH_EXTENSIONS_DIR=")
            runs_tests = re.search(r"\bpytest(?=\s|$)|tests\.upstream_compat\.run", line)
            if runs_tests and not exported and "TORCH_EXTENSIONS_DIR=" not in line:
                problems.append(line.strip())
    return problems


def stale_statement_problems(apply_md, tox_ini):
    problems = []
    if "working tree's files are left alone" in " ".join(apply_md.split()):
        problems.append("apply.md: --checkout leaves the working tree's files alone (it switches HEAD)")
    if "prefixes 1 to 9" in tox_ini:
        problems.append("tox.ini: bisect covers prefixes 1 to 9 (scripts/prove-series.sh runs every prefix)")
    return problems


def test_fork_recipes_work_as_written():
    for name in ("cherry-pick.md", "forks.md", "apply.md", "troubleshooting.md", "quickstart.md"):
        assert recipe_problems((GUIDE / name).read_text()) == [], name


def test_direct_test_commands_use_a_private_extensions_dir():
    for name in ("cherry-pick.md", "forks.md"):
        assert extensions_dir_problems((GUIDE / name).read_text()) == [], name


def test_no_stale_statements():
    assert stale_statement_problems((GUIDE / "apply.md").read_text(), (REPO / "tox.ini").read_text()) == []


def test_checks_find_what_they_look_for():
    assert recipe_problems("each can be\ntaken alone") and recipe_problems("```bash\ngit switch -c x v0.19.0\n```")
    assert recipe_problems("```bash\ngit am --3way p\n```") and recipe_problems("tox -e cpu --notest installs the deps")
    assert extensions_dir_problems("```bash\ncd tests && pytest unit\n```\n")
    assert not extensions_dir_problems("```bash\nexport TORCH_EXTENSIONS_DIR=x\npytest t\n```\n")


def graph_entries(text):
    """{patch number: its 'alone: ...' line} of a generated graph."""
    return dict(re.findall(r"^(\d{4}) .*\n +(alone: .*)$", text, re.M))


def test_forks_page_quotes_the_generated_graph():
    page = (GUIDE / "forks.md").read_text()
    assert "```{literalinclude} series-deps-v0.19.2.txt" in page
    graph = graph_entries((GUIDE / "series-deps-v0.19.2.txt").read_text())
    # what the page says in words about the graph
    assert graph["0004"].startswith("alone: does not apply") and graph["0008"].startswith("alone: does not apply")
    assert graph["0016"].startswith("alone: applies;") and "uses 0015 (__zero_grad_to_reduce)" in graph["0016"]


def test_dependency_graph_matches_the_series():
    """The committed graph is the one scripts/series-deps.py makes of patches/v0.19.2 now (a tree build and
    git blame of each patch: about 30 s of CPU)."""
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "series-deps.py"), "v0.19.2", "--check"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr + run.stdout


def test_upgrade_table_matches_the_series():
    page = (GUIDE / "forks.md").read_text()
    assert "```{literalinclude} series-upgrade-v0.19.2-v0.19.8.txt" in page
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "series-deps.py"), "v0.19.2", "--upgrade", "v0.19.8",
                          "--check"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr + run.stdout
