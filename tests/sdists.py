"""Where the tests find DeepSpeed sdists: where scripts/apply.sh looks (ZERO3_TEST_SDIST, then
DEEPSPEED_SDIST, then each PIP_FIND_LINKS directory). A test that needs an sdist found nowhere
skips, saying why, when pip may not reach an index (PIP_NO_INDEX): offline means offline."""

import os
from pathlib import Path


def sdist_name(version):
    return f"deepspeed-{version.lstrip('v')}.tar.gz"


def local_sdist(version):
    """The sdist of VERSION (v0.19.2 or 0.19.2) from ZERO3_TEST_SDIST, DEEPSPEED_SDIST or a
    PIP_FIND_LINKS directory, or None. A variable may name the file itself or its directory."""
    name = sdist_name(version)
    candidates = [os.environ.get("ZERO3_TEST_SDIST"), os.environ.get("DEEPSPEED_SDIST")]
    candidates += [d[len("file://"):] if d.startswith("file://") else d
                   for d in os.environ.get("PIP_FIND_LINKS", "").split()]
    for cand in filter(None, candidates):
        path = Path(cand)
        if path.is_dir():
            path = path / name
        if path.is_file() and path.name == name:
            return path
    return None


def index_disabled():
    return os.environ.get("PIP_NO_INDEX", "").strip().lower() not in ("", "0", "false", "no", "off")


def offline_and_missing(*versions):
    """The skip reason when pip may not download and some of VERSIONS' sdists are nowhere local,
    else None (they are local, or apply.sh may download them)."""
    missing = [sdist_name(v) for v in versions if local_sdist(v) is None]
    if missing and index_disabled():
        return (f"{', '.join(missing)} not in ZERO3_TEST_SDIST, DEEPSPEED_SDIST or PIP_FIND_LINKS, and "
                "PIP_NO_INDEX forbids downloading (on a networked machine, 'pip download --no-deps "
                "--no-binary :all: deepspeed==X.Y.Z' fetches one into a wheelhouse)")
    return None
