"""How many ranks the scenarios run on, and a record of the world sizes they actually ran at.

The suite asks for 2 ranks (REQUESTED_WORLD_SIZE). On CUDA each rank needs a GPU of its own (NCCL
cannot place two ranks on one device), so a host with one GPU runs the suite at world size 1: ZeRO-3
still partitions every parameter there and the checkpointing crash reproduces, so nearly every
scenario means the same thing. A test that needs more ranks than the session has (one that checks
what happens to a peer rank, say) carries ``@pytest.mark.needs_ranks(n)`` and is skipped with a
reason naming the GPU count. ``ZERO3_WORLD_SIZE`` (or pytest's ``--world-size``) overrides the
choice on CPU and CUDA alike, so the single-rank path runs in CPU CI too.

Nothing here imports torch into the calling process: the GPU count comes from a child interpreter,
which also keeps the pytest process free of any CUDA state.
"""

import dataclasses
import os
import subprocess
import sys
from typing import Optional

REQUESTED_WORLD_SIZE = 2


class WorldSizeError(ValueError):
    """A world size that cannot be run here (malformed, or more ranks than GPUs)."""


@dataclasses.dataclass(frozen=True)
class WorldChoice:
    world_size: int  # ranks of the scenario pools
    capacity: Optional[int]  # most ranks a test may start here; None: no limit (CPU ranks share the cores)
    device: str
    gpus: Optional[int]  # visible GPUs (None on CPU, where they were not counted)
    source: str  # what set world_size: "ZERO3_WORLD_SIZE=1", "--world-size 1" or "" (the default rule)

    @property
    def why(self):
        """Why world_size is what it is, for headers, skip reasons and the summary."""
        parts = [self.source] if self.source else []
        if self.gpus is not None:
            parts.append(f"{self.gpus} GPU{'' if self.gpus == 1 else 's'} visible")
        if not parts:
            parts.append(f"the suite's default of {REQUESTED_WORLD_SIZE} ranks on {self.device}")
        return ", ".join(parts)

    def skip_reason(self, needed):
        """The reason to skip a test that needs ``needed`` ranks, or None when this session has them."""
        if needed <= self.world_size:
            return None
        return f"needs {needed} ranks; this session runs {self.world_size} ({self.why})"

    def shortfall(self, needed):
        """The reason a pool of ``needed`` ranks cannot start here, or None when it can."""
        if self.capacity is None or needed <= self.capacity:
            return None
        return f"{needed} ranks required, {self.capacity} available ({self.why})"


def parse_world_size(text, source):
    value = str(text).strip()
    if not value.isdigit() or int(value) < 1:
        raise WorldSizeError(f"{source}: expected a positive number of ranks, got {text!r}")
    return int(value)


def choose(device, *, gpus=None, override=None, source="", requested=REQUESTED_WORLD_SIZE):
    """The world size for ``device``: ``override`` if given, else ``requested`` capped by the GPU count.

    ``gpus`` is the number of visible GPUs (needed on CUDA only). Raises WorldSizeError when CUDA has
    no GPU or the override asks for more ranks than there are GPUs.
    """
    if device == "cuda":
        if not gpus:
            raise WorldSizeError("ZERO3_TEST_DEVICE=cuda, but torch sees no GPU (check CUDA_VISIBLE_DEVICES "
                                 "and the driver), so no rank can start")
        if override is not None and override > gpus:
            raise WorldSizeError(f"{source} asks for {override} ranks, but only {gpus} GPU"
                                 f"{'' if gpus == 1 else 's'} {'is' if gpus == 1 else 'are'} visible and each "
                                 f"NCCL rank needs a GPU of its own")
        if override is not None:
            return WorldChoice(override, override, device, gpus, source)
        return WorldChoice(min(requested, gpus), gpus, device, gpus, "")
    if override is not None:
        return WorldChoice(override, override, device, None, source)
    return WorldChoice(requested, None, device, None, "")


def visible_gpus(python=None, timeout=180):
    """The number of GPUs torch sees, asked of a child interpreter (honours CUDA_VISIBLE_DEVICES)."""
    code = "import torch; print(torch.cuda.device_count())"
    try:
        proc = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise WorldSizeError(f"counting GPUs (python -c {code!r}) took more than {timeout} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].isdigit():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorldSizeError(f"could not count GPUs with torch (exit {proc.returncode}): {tail}")
    return int(lines[-1])


def session_choice(device, option=None):
    """The choice for this process: --world-size (``option``) wins over ZERO3_WORLD_SIZE; GPUs counted on CUDA."""
    override, source = None, ""
    if option is not None:
        override, source = parse_world_size(option, "--world-size"), f"--world-size {option}"
    elif os.environ.get("ZERO3_WORLD_SIZE", "").strip():
        text = os.environ["ZERO3_WORLD_SIZE"]
        override, source = parse_world_size(text, "ZERO3_WORLD_SIZE"), f"ZERO3_WORLD_SIZE={text.strip()}"
    gpus = visible_gpus() if device == "cuda" else None
    return choose(device, gpus=gpus, override=override, source=source)


# ----- what ran at which world size --------------------------------------------------------------------------

_runs = []


def note_run(world_size):
    """Called by RankPool.execute for every scenario run."""
    _runs.append(world_size)


def take_runs():
    """The world sizes of the runs since the last call (a set), forgetting them."""
    sizes = set(_runs)
    _runs.clear()
    return sizes


class RunTally:
    """Per test: the world sizes its rank processes ran at and its outcome; per reason: the tests skipped
    for want of ranks. ``lines()`` is the summary printed after the tests."""

    def __init__(self):
        self.sizes = {}  # nodeid -> set of world sizes
        self.outcomes = {}  # nodeid -> "passed", "failed" or "skipped"
        self.short_of_ranks = {}  # nodeid -> skip reason

    def ran(self, nodeid, sizes):
        if sizes:
            self.sizes.setdefault(nodeid, set()).update(sizes)

    def outcome(self, nodeid, outcome):
        # a failure in any phase (setup, call, teardown) makes the test count as failed
        if self.outcomes.get(nodeid) != "failed":
            self.outcomes[nodeid] = outcome

    def skipped_for_ranks(self, nodeid, reason):
        self.short_of_ranks[nodeid] = reason

    def lines(self, choice):
        by_size = {}
        for nodeid, sizes in self.sizes.items():
            for size in sizes:
                counts = by_size.setdefault(size, {})
                outcome = self.outcomes.get(nodeid, "passed")
                counts[outcome] = counts.get(outcome, 0) + 1
        lines = []
        for size in sorted(by_size):
            counts = by_size[size]
            detail = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
            total = sum(counts.values())
            lines.append(f"{total} test{'' if total == 1 else 's'} ran ranks at world size {size} ({detail})")
        if self.short_of_ranks:
            reasons = sorted(set(self.short_of_ranks.values()))
            n = len(self.short_of_ranks)
            lines.append(f"{n} test{'' if n == 1 else 's'} skipped for want of ranks: {'; '.join(reasons)}")
        if not lines:
            lines.append("no test started rank processes")
        head = f"zero3 world size: {choice.world_size} on {choice.device} ({choice.why})"
        return [head] + ["  " + line for line in lines]
