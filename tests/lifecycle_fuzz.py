"""Property-based search for ZeRO-3 parameter-lifecycle bugs: hypothesis draws small models
(tests/scenarios/fuzz_lifecycle.py describes the case format and runs them on every rank), each case
is trained under ZeRO-3 on 2 ranks against a plain torch reference, and a failing case is shrunk and
printed as a test ready to paste.

Two ways to run it:

- ``tests/test_lifecycle_fuzz.py`` (in ``tox -e cpu``): a fixed seed and a fixed number of cases.
- ``python -m tests.lifecycle_fuzz`` (``tox -e fuzz``): searches with random seeds for
  ``--seconds`` (default $ZERO3_FUZZ_SECONDS, else 1800), keeping hypothesis's example database in
  ``.hypothesis/`` (git-ignored), and prints how many cases ran and which invariant each failure
  broke. Every third run (``--volume-every``) draws only cases for which invariant I10 promises
  the frozen all-gather volume, which few cases of the general draw meet. ``--keep-going`` records
  every failing case and goes on instead of shrinking the first one (a census of how often each
  invariant breaks). Ctrl-C stops it with the same summary and exit status 130.

Nothing here knows the DeepSpeed release or patch series under test: the search checks the
invariants of whatever DeepSpeed the rank processes import.
"""

import argparse
import collections
import importlib
import os
import pprint
import random
import re
import sys
import time

import hypothesis
import hypothesis.errors
from hypothesis import HealthCheck, Phase, given, note, reject, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.harness import RankPool

TARGET = "tests.scenarios.fuzz_lifecycle:run_case"
CASE_TIMEOUT = 180  # seconds: a case takes 1 to 10 s on 2 CPU ranks; more is a hang
MAX_DEPTH = 4
DIM = 4

# Short names of the tags of tests/scenarios/fuzz_lifecycle.py (TAGS there says what each means), and
# of what the parent sees itself. (That module imports DeepSpeed, which this process does not.)
TAG_NAMES = {"error": "ZeRO-3 raised, the reference did not", "grad": "gradients differ from the reference",
             "I1": "quiescence", "I4": "prompt release", "I7": "accounting", "I8": "bounded forward stack",
             "I10": "volume", "died": "a rank died", "hang": "a rank hung"}

PARAM = st.sampled_from(["trainable", "frozen", "none"])
CKPT = st.sampled_from(["none", "module", "function", "function-relu", "reentrant"])
AUX = st.sampled_from(["none", "positional", "keyword"])


# Cases for which invariant I10 promises at most the frozen all-gather volume of the run without
# checkpointing (tests/scenarios/fuzz_lifecycle.py:volume_promised): every module's output requires
# grad (no no_grad region, no leaf output, an input that requires grad), non-reentrant
# checkpointing only, reuse distance 0. Equality where, besides, prefetching is off and every
# module runs once (volume_exact).
VOLUME_CKPT = st.sampled_from(["module", "function", "function-relu", "none"])


@st.composite
def child_ops(draw, n_children, volume=False):
    ckpt = draw(VOLUME_CKPT if volume else CKPT)
    # torch's reentrant checkpoint takes no keyword arguments: such a call is not a valid model
    how = draw(st.sampled_from(["none", "positional"]) if ckpt == "reentrant" else AUX)
    return ["child", draw(st.integers(0, n_children - 1)), ckpt, draw(st.integers(1, 3)), how]


def ops(n_children, volume=False):
    choices = [
        st.just(["linear"]),
        st.just(["scale"]),
        st.builds(lambda a: ["act", a], st.sampled_from(["tanh", "relu", "sin"])),
        st.builds(lambda k: ["external", k], st.integers(0, 7)),
    ]
    if n_children:
        # listed first: shrinking moves towards earlier alternatives, and a child call is what most
        # findings need (listed twice: drawn twice as often as a no_grad region)
        calls = child_ops(n_children, volume)
        no_grad = st.builds(lambda i: ["nograd", i], st.integers(0, n_children - 1))
        choices = [calls, calls] + ([] if volume else [no_grad]) + choices
    return st.one_of(*choices)


@st.composite
def nodes(draw, depth=1, volume=False):
    # the root of a volume case has a child, which it calls under checkpointing first (below)
    n_children = draw(st.integers(1 if volume and depth == 1 else 0, 2)) if depth < MAX_DEPTH else 0
    children = [draw(nodes(depth + 1, volume)) for _ in range(n_children)]
    outputs = ["tensor", "tuple", "dict", "param", "tensor"] + ([] if volume else ["leaf"])
    node_ops = draw(st.lists(ops(n_children, volume), min_size=1, max_size=4))
    if volume and depth == 1:
        node_ops.insert(0, ["child", 0, draw(VOLUME_CKPT.filter(lambda c: c != "none")), 1, "none"])
    return {
        "params": {
            "w": draw(PARAM),
            "s": draw(PARAM)
        },
        "children": children,
        "ops": node_ops,
        # weighted: a leaf output or a z3 leaf anywhere changes the whole case, and I10 is only
        # promised without leaf outputs
        "output": draw(st.sampled_from(outputs)),
        # z3 leaf modules have findings of their own (tests/test_lifecycle_fuzz.py), none about I10
        "z3_leaf": False if volume else draw(st.sampled_from([False, False, False, True])),
    }


@st.composite
def cases(draw, volume=False):
    """A case; ``volume=True`` draws only cases for which I10 promises the volume (see VOLUME_CKPT)."""
    return {
        "dim": DIM,
        "model": draw(nodes(volume=volume)),
        "inputs": {
            "x_grad": True if volume else draw(st.sampled_from([True, True, False])),
            "aux": draw(AUX),
            "aux_grad": draw(st.booleans())
        },
        "forwards": draw(st.integers(1, 3)),
        "early_stop": draw(st.booleans()),
        "zero": {
            "gas": draw(st.integers(1, 3)),
            # with prefetching on, I10 promises at most the volume without checkpointing, not equality
            "prefetch": draw(st.sampled_from(["0", "default"])),
            "reuse": "0" if volume else draw(st.sampled_from(["0", "default"])),
            "persistence": draw(st.sampled_from(["0", "vectors", "default"])),
            # drawn last, so that a seed draws the same cases in every other field as before it existed
            "bucket": draw(st.sampled_from(["default", "one-param"])),
        },
        "steps": 2,
    }


_violation_classes = {}


def violation_class(tag):
    """One exception class per invariant, so that hypothesis counts failures of different
    invariants as different bugs (it tells bugs apart by exception type and place)."""
    if tag not in _violation_classes:
        _violation_classes[tag] = type(f"LifecycleViolation_{tag}", (AssertionError, ), {"tag": tag})
    return _violation_classes[tag]


def classify(outcome):
    """(tag, one-line summary) of a failed RunOutcome."""
    errors = [r for r in outcome.ranks if r.status == "error"]
    for r in sorted(errors, key=lambda r: r.order):
        match = re.match(r"\[(\w+)\] ", r.message)
        if match:
            # the first line, and the first problem of a list
            return match.group(1), " ".join(r.message.strip().splitlines()[:2])[:300]
    if errors:
        r = min(errors, key=lambda r: r.order)
        return "error", f"{r.error_type}: {r.message.strip().splitlines()[0][:300] if r.message.strip() else ''}"
    if any(r.status == "died" for r in outcome.ranks):
        return "died", "a rank process died"
    return "hang", "a rank did not answer"


class Stats:
    """What a search saw: cases run, rejected, and failures by invariant."""

    def __init__(self):
        self.cases = 0
        self.rejected = 0
        self.skipped = collections.Counter()  # known finding -> cases not run
        self.error_types = collections.Counter()  # exception type of the "error" failures
        self.volume_checked = 0
        self.failures = collections.Counter()
        self.examples = {}  # tag -> (summary, case) of the first failure with that tag
        self.seconds = 0.0
        self.verbose = False  # print every failing case as it happens

    def summary(self):
        lines = [f"{self.cases} cases ran, shrinking included ({self.rejected} rejected as invalid torch models, "
                 f"{self.volume_checked} with the all-gather volume checked) in {self.seconds:.0f} s"]
        for known, count in sorted(self.skipped.items()):
            lines.append(f"  not run, matching known finding {known}: {count} case(s)")
        if not self.failures:
            lines.append("no invariant broke")
        for tag, count in sorted(self.failures.items()):
            lines.append(f"  {tag} ({TAG_NAMES.get(tag, '')}): {count} failing case(s); first: {self.examples[tag][0]}")
        if self.error_types:
            lines.append("  errors by type: " + ", ".join(f"{t} x{n}" for t, n in sorted(self.error_types.items())))
        return "\n".join(lines)


def paste_ready(case, tag, summary):
    """A test that re-runs ``case``, for tests/test_lifecycle_fuzz.py."""
    literal = pprint.pformat(case, width=100, sort_dicts=False)
    body = "\n".join("        " + line for line in literal.splitlines())
    return (f"@finding(\"{tag}\", \"...\")  # a strict xfail on the whole series until fixed\n"
            f"def test_fuzz_case_{tag.lower()}_CHANGEME(fuzz_pool):\n"
            f"    \"\"\"{summary[:200]}\"\"\"\n"
            f"    run_case(fuzz_pool,\n{body})\n")


def check(pool, case):
    """Runs one case on ``pool``. Returns (violation, volume_checked): violation is None if the case
    held every invariant, else (tag, summary, report). Raises ValueError when the reference itself
    cannot run the case."""
    outcome = pool.execute(TARGET, {"case": case}, timeout=CASE_TIMEOUT)
    if outcome.failed:
        tag, summary = classify(outcome)
        return (tag, summary, outcome.describe()), False
    result = outcome.values[0]
    if "invalid" in result:
        raise ValueError(result["invalid"])
    return None, result["volume_checked"]


def raise_violation(tag, summary, report):
    raise violation_class(tag)(f"{summary}\n\n{report}")


def run_case(pool, case, stats=None, skip=None):
    """check() inside a hypothesis search: raises the violation class of the invariant that broke,
    or rejects a case the reference itself cannot run, or one that ``skip(case)`` (known findings
    of the tree under test) matches."""
    if skip is not None and skip(case):
        if stats is not None:
            stats.skipped[skip(case)] += 1
        reject()
    t0 = time.monotonic()
    try:
        found, volume_checked = check(pool, case)
    except ValueError:
        if stats is not None:
            stats.rejected += 1
        reject()
    finally:
        if stats is not None:
            stats.cases += 1
            stats.seconds += time.monotonic() - t0
    if volume_checked and stats is not None:
        stats.volume_checked += 1
    if found:
        tag, summary, report = found
        if stats is not None:
            stats.failures[tag] += 1
            stats.examples.setdefault(tag, (summary, case))
            if tag == "error":
                stats.error_types[summary.split()[1]] += 1
            if stats.verbose:
                print(f"case {stats.cases}: [{tag}] {summary}\n  {case}", flush=True)
        note("paste-ready regression test:\n" + paste_ready(case, tag, summary))
        raise_violation(tag, summary, report)


def search(pool, *, max_examples, seed=None, database=None, reuse=True, keep_going=False, stats=None, skip=None,
           volume=False):
    """Runs one hypothesis search of ``max_examples`` cases; returns the Stats. Without a seed
    and a database it is derandomized (a fixed seed). With ``keep_going``, failing cases are
    recorded and the search goes on, unshrunk; otherwise the first failure is shrunk and raised
    (hypothesis prints the shrunk case and the paste-ready test). ``reuse=False`` does not replay
    the database's failures (it still saves new ones). ``skip(case)`` names the known finding a
    case would only find again, or returns None. ``volume`` draws only cases that check I10."""
    stats = stats or Stats()
    phases = [Phase.explicit, Phase.generate, Phase.target]
    if reuse:
        phases.insert(1, Phase.reuse)
    if not keep_going:
        phases.append(Phase.shrink)

    @settings(max_examples=max_examples,
              derandomize=seed is None and database is None,
              database=database,
              deadline=None,
              phases=phases,
              print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(volume))
    def property_holds(case):
        try:
            run_case(pool, case, stats, skip)
        except AssertionError:
            if not keep_going:
                raise

    if seed is not None:
        property_holds = hypothesis.seed(seed)(property_holds)
    property_holds()
    return stats


def _tags(error):
    """The invariant tags of what a search raised (hypothesis raises an ExceptionGroup when it
    found several distinct bugs)."""
    if isinstance(error, BaseExceptionGroup):
        return [tag for e in error.exceptions for tag in _tags(e)]
    return [getattr(error, "tag", type(error).__name__)]


def _notes(error):
    """What hypothesis attached to what it raised: the shrunk ("falsifying") case and our note with the
    paste-ready test. Hypothesis adds them to the exception as notes instead of printing them when the
    exception is caught, as main's loop does."""
    notes = list(getattr(error, "__notes__", []))
    if isinstance(error, BaseExceptionGroup):
        for e in error.exceptions:
            notes += _notes(e)
    return notes


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.lifecycle_fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("ZERO3_FUZZ_SECONDS") or 1800),
                        help="start no new run after this many seconds; the run in progress finishes, its shrinking "
                        "included (default: $ZERO3_FUZZ_SECONDS, else 1800)")
    parser.add_argument("--chunk", type=int, default=20, help="cases per hypothesis run, each with a new seed")
    parser.add_argument("--seed", type=int, default=None, help="seeds the seeds of the runs (default: random)")
    parser.add_argument("--database", default=".hypothesis/zero3-lifecycle",
                        help="hypothesis example database directory, '' for none (default: %(default)s)")
    parser.add_argument("--skip-known", metavar="MODULE:NAME", default=None,
                        help="a function case -> name of the known finding it matches, or None; matching cases "
                        "are not run (e.g. tests.test_lifecycle_fuzz:known_finding for the v0.19.2 series)")
    parser.add_argument("--volume-every", type=int, default=3, metavar="N",
                        help="every Nth run draws only cases for which I10 promises the frozen all-gather volume, "
                        "which few drawn cases meet otherwise; 0 for none (default: %(default)s)")
    parser.add_argument("--keep-going", action="store_true",
                        help="record every failing case and go on, instead of shrinking each first failure")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.chunk <= 0:
        parser.error("--seconds and --chunk must be positive")
    if args.volume_every < 0:
        parser.error("--volume-every must be 0 (no volume runs) or positive")
    database = DirectoryBasedExampleDatabase(args.database) if args.database else None
    skip = None
    if args.skip_known:
        module, _, name = args.skip_known.partition(":")
        skip = getattr(importlib.import_module(module), name)
    master_seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(master_seed)
    print(f"lifecycle fuzz: searching for {args.seconds:g} s, {args.chunk} cases per run, seed of seeds "
          f"{master_seed}, database {args.database or '(none)'}, "
          f"{'census (no shrinking)' if args.keep_going else 'shrinking each failure'}", flush=True)
    stats = Stats()
    findings = collections.Counter()
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    run = 0
    try:
        with RankPool(2, name="fuzz") as pool:
            while time.monotonic() < deadline:
                seed = rng.getrandbits(64)
                volume = args.volume_every > 0 and run % args.volume_every == args.volume_every - 1
                print(f"== run {run}: seed {seed}{', volume cases' if volume else ''} "
                      f"({time.monotonic() - t0:.0f} s in)", flush=True)
                try:
                    # only the first run replays the database's failures; later ones look for new ones
                    search(pool, max_examples=args.chunk, seed=seed, database=database, reuse=run == 0,
                           keep_going=args.keep_going, stats=stats, skip=skip, volume=volume)
                except hypothesis.errors.Unsatisfiable:
                    pass  # every case drawn was invalid or skipped
                except (AssertionError, BaseExceptionGroup) as error:
                    tags = _tags(error)
                    findings.update(tags)
                    print(f"== run {run} found: {', '.join(tags)}; the shrunk case and a paste-ready test:",
                          flush=True)
                    print("\n".join(_notes(error)) or "(hypothesis reported no case)", flush=True)
                run += 1
                print(stats.summary(), flush=True)
    except KeyboardInterrupt:
        # what the search found so far is the point of a long run: report it, then exit as SIGINT does
        print(f"\n== lifecycle fuzz interrupted in run {run}")
        _report(stats, findings, run, time.monotonic() - t0)
        return 130
    _report(stats, findings, run, time.monotonic() - t0)
    return 1 if stats.failures else 0


def _report(stats, findings, runs, seconds):
    print(f"\n== lifecycle fuzz: {runs} runs in {seconds:.0f} s")
    print(stats.summary())
    if findings:
        print("shrunk findings by invariant: " + ", ".join(f"{tag} x{n}" for tag, n in sorted(findings.items())))
    for tag, (summary, case) in sorted(stats.examples.items()):
        literal = pprint.pformat(case, width=100, sort_dicts=False)
        print(f"\nfirst case that broke {tag} (unshrunk): {summary}\n{literal}")


if __name__ == "__main__":
    sys.exit(main())
