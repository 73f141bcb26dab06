"""Stamps on generated inputs: which patch series revision and which DeepSpeed they measured.

Every file in docs/_generated/ carries a stamp (a JSON object), written by the script that
produced it:

* Markdown (``.md``): the first line, ``<!-- zero3-stamp: {...} -->`` (the {generated}
  directive strips it before parsing);
* JSON (``.json``): the top-level key ``"stamp"``;
* PNG (``.png``): a tEXt chunk with the keyword ``zero3-stamp``.

Stamp fields: ``series`` (the series directory under patches/, e.g. "v0.19.2"), ``series_id``
(see :func:`series_id`), ``patches`` (how many), ``deepspeed`` (the release(s) measured),
``trees`` (the trees the input compares, by name), ``command`` (what regenerates the input).

The documentation build compares each stamp with the series in patches/ now (docs/_ext/generated.py)
and fails naming the stale input and its command, unless conf.py's ``generated_historical`` lists
the input: then the page shows, beside it, on which revision it was measured.

Only the standard library; the scripts that write inputs import this module too.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Dict, List, Optional

KEY = "zero3-stamp"
_MD = re.compile(r"^<!-- " + KEY + r": (\{.*\}) -->\n?")
FIELDS = ("series", "series_id", "patches", "deepspeed", "trees", "command")


class StampError(ValueError):
    pass


def series_patches(patch_dir: Path) -> List[Path]:
    series = patch_dir / "series"
    if not series.is_file():
        raise StampError(f"{series} is missing")
    names = [line.split("#", 1)[0].strip() for line in series.read_text(encoding="utf-8").splitlines()]
    return [patch_dir / name for name in names if name]


def patch_text_id(text: str) -> str:
    """git's stable patch id: the same change has the same id whatever its commit, date or
    message, so re-exporting an unchanged series does not change its stamp."""
    run = subprocess.run(["git", "patch-id", "--stable"], input=text, capture_output=True, text=True, check=True)
    if not run.stdout.strip():
        raise StampError("git patch-id found no diff")
    return run.stdout.split()[0]


def series_id_of(patch_texts: List[str]) -> str:
    """12 hex digits of the sha256 over the patch ids of the series, in order."""
    ids = "\n".join(patch_text_id(text) for text in patch_texts)
    return hashlib.sha256(ids.encode()).hexdigest()[:12]


def series_id(patch_dir: Path) -> str:
    return series_id_of([p.read_text(encoding="utf-8", errors="replace") for p in series_patches(patch_dir)])


def make(patch_dir: Path, deepspeed: str, trees: List[str], command: str) -> Dict:
    """The stamp of an input measured now, on the series in patch_dir."""
    return {
        "series": patch_dir.name,
        "series_id": series_id(patch_dir),
        "patches": len(series_patches(patch_dir)),
        "deepspeed": deepspeed,
        "trees": list(trees),
        "command": command,
    }


# --------------------------------------------------------------------------- reading and writing


def _png_chunks(data: bytes):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise StampError("not a PNG file")
    pos = 8
    while pos < len(data):
        (length, ) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        yield pos, kind, data[pos + 8:pos + 8 + length]
        pos += 12 + length


def read(path: Path) -> Optional[Dict]:
    """The stamp of a generated input, or None if it has none."""
    suffix = path.suffix.lower()
    if suffix == ".md":
        match = _MD.match(path.read_text(encoding="utf-8"))
        return json.loads(match.group(1)) if match else None
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data.get("stamp") if isinstance(data, dict) else None
    if suffix == ".png":
        for _, kind, body in _png_chunks(path.read_bytes()):
            if kind == b"tEXt" and body.startswith(KEY.encode() + b"\0"):
                return json.loads(body.split(b"\0", 1)[1].decode("latin-1"))
        return None
    raise StampError(f"{path.name}: cannot carry a stamp (only .md, .json, .png)")


def strip_markdown(text: str) -> str:
    return _MD.sub("", text, count=1)


def stamp_markdown(text: str, stamp: Dict) -> str:
    return f"<!-- {KEY}: {json.dumps(stamp, ensure_ascii=False)} -->\n" + strip_markdown(text)


def write(path: Path, stamp: Dict) -> None:
    """Writes (or replaces) the stamp of an existing input in place."""
    missing = [f for f in FIELDS if f not in stamp]
    if missing:
        raise StampError(f"stamp lacks {', '.join(missing)}")
    suffix = path.suffix.lower()
    if suffix == ".md":
        path.write_text(stamp_markdown(path.read_text(encoding="utf-8"), stamp), encoding="utf-8")
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        data = {"stamp": stamp, **{k: v for k, v in data.items() if k != "stamp"}}
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    elif suffix == ".png":
        data = path.read_bytes()
        kept, iend = [], None
        for pos, kind, body in _png_chunks(data):
            if kind == b"tEXt" and body.startswith(KEY.encode() + b"\0"):
                continue
            if kind == b"IEND":
                iend = pos
                break
            kept.append(data[pos:pos + 12 + len(body)])
        body = KEY.encode() + b"\0" + json.dumps(stamp).encode("latin-1")
        chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
        path.write_bytes(data[:8] + b"".join(kept) + chunk + data[iend:])
    else:
        raise StampError(f"{path.name}: cannot carry a stamp (only .md, .json, .png)")


# --------------------------------------------------------------------------- checking


def inputs(generated: Path) -> List[Path]:
    """Every generated input that must carry a stamp: the files of generated/ and of its run
    directories, except READMEs."""
    return sorted(p for p in generated.rglob("*")
                  if p.is_file() and p.suffix.lower() in (".md", ".json", ".png") and p.name != "README.md")


def historical_reason(historical: Dict[str, str], rel: str) -> Optional[str]:
    """Why rel is kept as measured on an older revision (a key is a file or a directory/), or None."""
    for key, why in historical.items():
        if rel == key or (key.endswith("/") and rel.startswith(key)):
            return why
    return None


def check(generated: Path, patches: Path, historical: Dict[str, str]) -> List[str]:
    """Problems with the stamps of generated/: missing, malformed, or stale against the series
    in patches/ (patches/SERIES/ for each stamp's series) unless listed in historical (a dict
    relative path -> why it cannot be regenerated here). Each message names the input and the
    command that regenerates it."""
    problems, current = [], {}
    for path in inputs(generated):
        rel = path.relative_to(generated).as_posix()
        try:
            stamp = read(path)
        except (StampError, ValueError) as exc:
            problems.append(f"generated input {rel}: unreadable stamp ({exc})")
            continue
        if stamp is None:
            problems.append(f"generated input {rel} carries no stamp: regenerate it with its script, "
                            f"or stamp it with scripts/stamp-generated.py (see docs/generated-inputs.md)")
            continue
        missing = [f for f in FIELDS if f not in stamp]
        if missing:
            problems.append(f"generated input {rel}: stamp lacks {', '.join(missing)}")
            continue
        series_dir = patches / stamp["series"]
        if stamp["series"] not in current:
            try:
                current[stamp["series"]] = series_id(series_dir)
            except StampError as exc:
                problems.append(f"generated input {rel}: its series {stamp['series']}: {exc}")
                continue
        now = current[stamp["series"]]
        if stamp["series_id"] == now:
            if historical_reason(historical, rel) is not None:
                problems.append(f"generated input {rel} matches the current series {stamp['series']} "
                                f"({now}): remove it from generated_historical in docs/conf.py")
            continue
        if historical_reason(historical, rel) is not None:
            continue
        problems.append(f"generated input {rel} is stale: it measured series {stamp['series']} at "
                        f"{stamp['series_id']} ({stamp['patches']} patches), the series is now {now}. "
                        f"Regenerate it with: {stamp['command']}")
    for rel in historical:
        if not (generated / rel).exists():
            problems.append(f"generated_historical in docs/conf.py lists {rel}, which does not exist")
    return problems
