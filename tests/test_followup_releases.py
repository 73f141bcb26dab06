"""The table of the v0.19.8 follow-up on v0.19.3 ... v0.19.7 (docs/_generated/followup-releases.json and .md,
written by scripts/followup_releases.py) is current and complete, without building anything: it was made
from the units' and ports' patches as they are now, every release has every unit applied as it is or by
a port that says what differs, and every unit's own tests passed there. CI's --check run builds the trees."""

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location("followup_releases", ROOT / "scripts" / "followup_releases.py")
followup_releases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(followup_releases)

DATA = json.loads(followup_releases.OUT_JSON.read_text())
UNITS = followup_releases.batches_of(followup_releases.FOLLOWUP)
REGENERATE = "regenerate with: python scripts/followup_releases.py"


def test_table_was_made_from_the_patches_as_they_are():
    assert followup_releases.stale(DATA, UNITS) == [], REGENERATE


def test_a_changed_patch_makes_the_table_stale():
    changed = copy.deepcopy(DATA)
    changed["units"][-1]["patches"][0]["patch_id"] = "0" * 40
    assert followup_releases.stale(changed, UNITS) == ["the units or their patches in patches/v0.19.8 changed"]
    ported = next(e for r in changed["releases"] for e in r["units"] if e["port"])
    ported["port_patches"][0]["patch_id"] = "0" * 40
    assert f"the port {ported['port']} changed" in followup_releases.stale(changed, UNITS)


def test_a_port_of_an_older_unit_is_stale(monkeypatch):
    monkeypatch.setattr(followup_releases, "ported_from", lambda directory: [])
    problems = followup_releases.stale(DATA, UNITS)
    ports = [e["port"] for r in DATA["releases"] for e in r["units"] if e["port"]]
    assert ports and len(problems) == len(ports) and all("was made from another version" in p for p in problems)


def test_markdown_is_the_json_rendered():
    text = followup_releases.OUT_MD.read_text()
    assert text == followup_releases.stamps.stamp_markdown(followup_releases.render(DATA), DATA["stamp"]), \
        "python scripts/followup_releases.py --markdown"


def test_every_release_between_the_fix_and_v0198_is_listed():
    assert [r["release"] for r in DATA["releases"]] == followup_releases.RELEASES
    assert [u["unit"] for u in DATA["units"]] == list(UNITS)


@pytest.mark.parametrize("release", followup_releases.RELEASES)
def test_every_unit_is_applied_or_ported_and_its_tests_pass(release):
    record = next(r for r in DATA["releases"] if r["release"] == release)
    assert record["fix_8148"], f"{release} lacks upstream's fix #8148"
    assert [e["unit"] for e in record["units"]] == list(UNITS)
    for entry in record["units"]:
        assert entry["apply"] in (followup_releases.APPLIES, followup_releases.PORTED), (entry["unit"], entry["apply"])
        assert entry["tests"] is not None, f"{entry['unit']}: its tests did not run on {release}; {REGENERATE}"
        assert entry["tests"]["run"] > 0 and entry["tests"]["not_passing"] == [], (entry["unit"], entry["tests"])
        if entry["apply"] == followup_releases.PORTED:
            note = (ROOT / entry["port"] / "cover-letter.txt").read_text()
            subject, _, body = note.partition("\n\n")
            assert release in subject and len(body.split()) > 20, f"{entry['port']}: the note must say what differs"


def test_complete_reports_a_missing_unit():
    broken = copy.deepcopy(DATA)
    broken["releases"][0]["units"][-1]["apply"] = followup_releases.NEEDS_PORT
    release, unit = broken["releases"][0]["release"], broken["releases"][0]["units"][-1]["unit"]
    assert followup_releases.complete(broken) == [f"{release} {unit}: needs port"]
