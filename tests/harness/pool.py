"""A reusable pool of rank processes that run distributed scenarios (see tests/harness/__init__.py)."""

import atexit
import dataclasses
import importlib.metadata
import json
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, List, Optional

from tests.harness import world

REPO_ROOT = Path(__file__).resolve().parents[2]

LOG_TAIL_LINES = 60


def env_float(name, default):
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def default_device():
    device = os.environ.get("ZERO3_TEST_DEVICE", "").strip() or "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"ZERO3_TEST_DEVICE must be 'cpu' or 'cuda', not {device!r}")
    return device


def harness_tmpdir(prefix):
    """A new directory for logs: under $ZERO3_HARNESS_TMPDIR when set (the test sessions point it into pytest's
    own temporary directory, which pytest prunes after a few sessions), else in the system's temp dir."""
    root = os.environ.get("ZERO3_HARNESS_TMPDIR") or None
    if root:
        os.makedirs(root, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def keep_logs_under(basetemp):
    """Pools of this process make their log directories under basetemp/harness (pytest's temporary directory,
    which pytest prunes after a few sessions) rather than in the system's temp dir, unless
    ZERO3_HARNESS_TMPDIR is set already; a failed run's logs stay there for inspection."""
    os.environ.setdefault("ZERO3_HARNESS_TMPDIR", str(Path(basetemp) / "harness"))


def default_extensions_dir():
    # Keyed by Python and torch versions: a JIT-built op links against both.
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}_torch{importlib.metadata.version('torch')}"
    return str(Path.home() / ".cache" / "zero3-series" / "torch_extensions" / tag)


class PoolStartError(RuntimeError):
    """The rank processes could not be started or could not form a process group."""


@dataclasses.dataclass
class RankOutcome:
    rank: int
    status: str  # "ok", "skip", "error", "died" or "hung"
    value: Any = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    exitcode: Optional[int] = None
    order: int = -1  # position among the answers in arrival order
    log_path: str = ""
    log_tail: str = ""


@dataclasses.dataclass
class RunOutcome:
    target: str
    world_size: int
    device: str
    backend: str
    timeout: float
    grace: float
    elapsed: float
    ranks: List[RankOutcome]

    def _with(self, *statuses):
        return [r for r in self.ranks if r.status in statuses]

    @property
    def skipped(self):
        # A rank that skips while its peers wait in a collective leaves them hanging: that is still a skip.
        return bool(self._with("skip")) and not self._with("error", "died")

    @property
    def failed(self):
        return bool(self._with("error", "died", "hung")) and not self.skipped

    @property
    def values(self):
        return [r.value for r in self.ranks]

    @property
    def skip_message(self):
        skips = self._with("skip")
        text = "; ".join(f"rank {r.rank}: {r.message}" for r in skips)
        hung = self._with("hung")
        if hung:
            text += f" (ranks {_ranks(hung)} were killed while waiting for the skipped rank)"
        return text

    def describe(self):
        """The failure report: the first failing rank's traceback first, then the other ranks."""
        # A rank that died did so on its own (the pool kills nobody before every rank has answered or the grace
        # period is over), and its peers' errors are then mostly "connection reset": deaths go first, then the
        # errors in the order they arrived.
        failed = sorted(self._with("error", "died"), key=lambda r: (r.status != "died", r.order))
        hung = self._with("hung")
        lines = [f"scenario {self.target} failed (world_size={self.world_size}, {self.device}/{self.backend}, "
                 f"{self.elapsed:.1f} s)"]
        for r in failed:
            if r.status == "error":
                lines.append(f"rank {r.rank} raised {r.error_type}: {_first_line(r.message)}")
            else:
                lines.append(f"rank {r.rank} died: {_exit_text(r.exitcode)}")
        if hung and failed:
            lines.append(f"rank{'s' if len(hung) > 1 else ''} {_ranks(hung)} hung: no answer {self.grace:g} s after "
                         f"rank {failed[0].rank} failed (stuck in a collective?); killed")
        elif hung:
            lines.append(f"rank{'s' if len(hung) > 1 else ''} {_ranks(hung)} timed out: no answer within "
                         f"{self.timeout:g} s; killed")
        lines.append("the rank processes were stopped; the pool starts afresh for the next run")
        for r in failed + hung:
            lines.append("")
            if r.status == "error":
                lines.append(f"===== rank {r.rank} traceback =====")
                lines.append(r.traceback.rstrip())
            what = "Python stacks when killed, at the end" if r.status == "hung" else "output during this run"
            lines.append(f"===== rank {r.rank} log ({what}; last {LOG_TAIL_LINES} lines of {r.log_path}) =====")
            lines.append(r.log_tail.rstrip() or "(no output)")
        return "\n".join(lines)


class ScenarioFailed(AssertionError):
    """A scenario raised, died or hung on at least one rank; the message has the tracebacks and log tails."""

    def __init__(self, outcome):
        self.outcome = outcome
        super().__init__(outcome.describe())


def _ranks(outcomes):
    return ", ".join(str(r.rank) for r in outcomes)


def _first_line(text):
    lines = text.strip().splitlines()
    return lines[0] + (" [...]" if len(lines) > 1 else "") if lines else ""


def _exit_text(code):
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _send(conn, data):
    conn.send_bytes(data)


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _dumps(msg):
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def target_name(target):
    """'module:qualname' for a module-level function (or a string given as is)."""
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"target must look like 'package.module:function', not {target!r}")
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname or module == "__main__":
        raise TypeError(f"{target!r} cannot be imported by name in a rank process: use a module-level function")
    return f"{module}:{qualname}"


@dataclasses.dataclass
class _Rank:
    rank: int
    proc: Any  # subprocess.Popen, or _ForkedProc for a rank forked by a zygote
    conn: multiprocessing.connection.Connection
    pgid: int
    log_path: Path
    info: dict = dataclasses.field(default_factory=dict)


class _Zygote:
    """A process that imports DeepSpeed once and forks rank processes on request (see worker._zygote)."""

    def __init__(self, env, start_timeout):
        self.log_dir = harness_tmpdir("zero3-zygote-")
        self.log_path = self.log_dir / "zygote.log"
        parent_conn, child_conn = multiprocessing.Pipe()
        cfg = dict(fd=child_conn.fileno(), parent=os.getpid(), zygote=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", "tests.harness.worker"], cwd=self.log_dir,
                                             env=dict(env, ZERO3_HARNESS_CONFIG=json.dumps(cfg)),
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             pass_fds=(child_conn.fileno(), ), start_new_session=True)
            finally:
                child_conn.close()
        self.conn = parent_conn
        self.failed = False
        if not parent_conn.poll(start_timeout):
            self._fail(f"not ready after {start_timeout:g} s")
        try:
            self.info = _recv(parent_conn)[1]
        except (EOFError, OSError):
            self._fail(f"died while importing DeepSpeed: {_exit_text(self.proc.wait())}")
        if self.info.get("cuda_initialized"):
            self._fail("initialized CUDA while importing DeepSpeed, so ranks forked from it could not use the GPU")

    def _fail(self, why):
        self.failed = True
        self.close(keep_log=True)
        raise PoolStartError(f"the zygote process (pid {self.proc.pid}) {why}\n"
                             f"===== its log ({self.log_path}) =====\n{_tail(self.log_path, 0).rstrip()}")

    @property
    def alive(self):
        return self.proc.poll() is None and not self.conn.closed

    def request(self, msg, handle=None):
        try:
            _send(self.conn, _dumps(msg))
            if handle is not None:
                multiprocessing.reduction.send_handle(self.conn, handle, self.proc.pid)
            if self.conn.poll(30):
                return _recv(self.conn)
        except (EOFError, OSError):
            pass
        self.failed = True
        self.close(keep_log=True)
        raise PoolStartError(f"the zygote process (pid {self.proc.pid}) stopped answering\n"
                             f"===== its log ({self.log_path}) =====\n{_tail(self.log_path, 0).rstrip()}")

    def fork(self, cfg, env, log_path, fd):
        return _ForkedProc(self, self.request(("fork", cfg, env, str(log_path)), handle=fd)[1])

    def signal(self, pids, sig, pgid=0):
        if self.alive:
            try:
                self.request(("signal", list(pids), sig, pgid))
            except PoolStartError:
                pass  # it died: so did its ranks

    def close(self, keep_log=False):
        self.conn.close()  # the zygote exits on EOF and takes any rank still running with it
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not keep_log and not self.failed:
            shutil.rmtree(self.log_dir, ignore_errors=True)


class _ForkedProc:
    """The part of subprocess.Popen's interface the pool uses, for a rank forked by (and reaped by) a zygote."""

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self):
        if self.returncode is None:
            try:
                self.returncode = self.zygote.request(("exitcode", self.pid))[1] if self.zygote.alive else None
            except PoolStartError:
                pass
            if not self.zygote.alive:
                self.returncode = -signal.SIGKILL  # the zygote's death took its ranks down
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig):
        self.zygote.signal([self.pid], sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


# Zygotes are shared by every pool of this process whose ranks get the same environment.
_zygotes = {}
# Set when forked CUDA ranks could not start: from then on, CUDA pools spawn their ranks.
_cuda_fork_failed = False


def _give_up_cuda_fork(error):
    global _cuda_fork_failed
    if not _cuda_fork_failed:
        _cuda_fork_failed = True
        first = error.strip().splitlines()[0] if error.strip() else "no error text"
        print(f"zero3 harness: ranks forked on CUDA could not start ({first}); spawning CUDA ranks from now on "
              f"(slower: each imports DeepSpeed). ZERO3_TEST_FORK=0 spawns from the start.", file=sys.stderr)


def _zygote_for(env, start_timeout):
    # pytest rewrites PYTEST_CURRENT_TEST for every test; it must not make every pool start a zygote of its own.
    key = tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))
    zygote = _zygotes.get(key)
    if zygote is None or not zygote.alive:
        zygote = _zygotes[key] = _Zygote(env, start_timeout)
    return zygote


def close_zygotes():
    while _zygotes:
        _zygotes.popitem()[1].close()


_live_pools = weakref.WeakSet()


@atexit.register
def _close_live_pools():
    for pool in list(_live_pools):
        pool.close()
    close_zygotes()


class RankPool:
    """``world_size`` rank processes that import DeepSpeed and join one process group once, then run scenarios.

    The processes start on the first ``run``; after a run in which any rank raised, died or hung they are
    killed, and the next ``run`` starts new ones.
    """

    def __init__(self, world_size=2, device=None, *, backend=None, init_distributed=True, set_dist_env=True,
                 shm_op=None, start_timeout=None, log_dir=None, env=None, name="pool"):
        self.world_size = int(world_size)
        self.device = device or default_device()
        self.backend = backend or ("nccl" if self.device == "cuda" else "gloo")
        self.init_distributed = init_distributed
        self.set_dist_env = set_dist_env
        self.shm_op = bool(int(os.environ.get("ZERO3_TEST_SHM_OP", "0"))) if shm_op is None else shm_op
        self.start_timeout = start_timeout or env_float("ZERO3_POOL_START_TIMEOUT", 600.0)
        self.env = dict(env or {})
        # Fork ranks from a zygote that has imported DeepSpeed; ZERO3_TEST_FORK=0 spawns each rank. On CUDA a
        # pool whose forked ranks cannot start falls back to spawning, and so do all later CUDA pools.
        self.fork = os.environ.get("ZERO3_TEST_FORK", "1") != "0" and not (self.device == "cuda" and _cuda_fork_failed)
        self._zygote = None
        self.name = name
        self._own_log_dir = log_dir is None and not os.environ.get("ZERO3_TEST_LOG_DIR")
        self.log_dir = Path(log_dir or os.environ.get("ZERO3_TEST_LOG_DIR") or harness_tmpdir("zero3-ranks-"))
        self._keep_logs = False
        self._ranks: List[_Rank] = []
        self.generation = 0
        self._task_id = 0
        self._start_failures = 0
        self._last_start_error = None
        self.stats = {"starts": [], "runs": 0}
        _live_pools.add(self)

    # ----- life cycle -------------------------------------------------------------------------------------------

    @property
    def alive(self):
        return bool(self._ranks)

    @property
    def pids(self):
        return [r.proc.pid for r in self._ranks]

    @property
    def zygote_pid(self):
        """The pid of the process the ranks are forked from (None when ranks are spawned: ZERO3_TEST_FORK=0, or
        CUDA after forking failed)."""
        return self._zygote.proc.pid if self._zygote else None

    @property
    def info(self):
        """Per-rank facts reported at start: pid, timings, DeepSpeed version and file, accelerator."""
        return [r.info for r in self._ranks]

    def start(self):
        if self._ranks:
            return
        if self._start_failures >= 2:
            raise PoolStartError(f"{self.name}: not starting again after {self._start_failures} failed starts; "
                                 f"the last one said:\n{self._last_start_error}")
        t0 = time.monotonic()
        for attempt in range(3):
            try:
                self._spawn(t0 + self.start_timeout)
                self._handshake(t0 + self.start_timeout)
                break
            except PoolStartError as e:
                self._kill()
                self._keep_logs = True
                text = str(e)
                if self.fork and self.device == "cuda":
                    _give_up_cuda_fork(text)
                    self.fork, self._zygote = False, None
                    continue
                if ("EADDRINUSE" in text or "ddress already in use" in text) and attempt < 2:
                    continue
                self._start_failures += 1
                self._last_start_error = text
                raise
        self._start_failures = 0
        self.stats["starts"].append(round(time.monotonic() - t0, 2))

    def close(self):
        """Stop the rank processes (they also exit on their own when this process dies)."""
        self._kill(graceful=True)
        _live_pools.discard(self)
        if self._own_log_dir and not self._keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _base_env(self):
        env = dict(os.environ)
        env.update(self.env)
        # With LOCAL_SIZE set, DeepSpeed's CPU shm op (when loaded) maps /dev/shm segments that it never
        # unlinks: every killed pool would leak them.
        env.pop("LOCAL_SIZE", None)
        path = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(path)
        env["PYTHONUNBUFFERED"] = "1"
        env["DS_ACCELERATOR"] = self.device
        env.setdefault("TORCH_EXTENSIONS_DIR", default_extensions_dir())
        return env

    def _rank_env(self, base_env):
        env = dict(base_env)
        if self.device == "cpu":
            # Ranks share the cores: without this, each rank runs one intra-op thread per core and they thrash.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.world_size)))
        return env

    def _spawn(self, deadline):
        self.generation += 1
        run_dir = self.log_dir / f"{self.name}-{self.generation}"
        run_dir.mkdir(parents=True, exist_ok=True)
        base_env = self._base_env()
        rank_env = self._rank_env(base_env)
        if self.fork:
            zygote_env = dict(base_env)
            if self.device == "cuda":
                # DeepSpeed's import asks whether CUDA is available; through NVML that leaves the driver
                # uninitialized, which forking requires (worker._zygote).
                zygote_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
            self._zygote = _zygote_for(zygote_env, max(1.0, deadline - time.monotonic()))
        for rank in range(self.world_size):
            parent_conn, child_conn = multiprocessing.Pipe()
            cfg = dict(fd=child_conn.fileno(), parent=os.getpid(), rank=rank, world_size=self.world_size,
                       device=self.device, backend=self.backend, init_distributed=self.init_distributed,
                       set_dist_env=self.set_dist_env, shm_op=self.shm_op)
            log_path = run_dir / f"rank{rank}.log"
            # One process group for the whole pool (led by rank 0), so that a kill also reaches anything the
            # ranks started themselves (a compiler, say).
            pgid = self._ranks[0].pgid if self._ranks else 0
            try:
                if self._zygote:
                    proc = self._zygote.fork(dict(cfg, pgid=pgid), rank_env, log_path, child_conn.fileno())
                else:
                    proc = self._popen(cfg, rank_env, log_path, run_dir, pgid)
            finally:
                child_conn.close()
            self._ranks.append(_Rank(rank, proc, parent_conn, pgid or proc.pid, log_path))

    def _popen(self, cfg, env, log_path, run_dir, pgid):
        with open(log_path, "ab") as log:
            args = dict(cwd=run_dir, env=dict(env, ZERO3_HARNESS_CONFIG=json.dumps(cfg)), stdin=subprocess.DEVNULL,
                        stdout=log, stderr=subprocess.STDOUT, pass_fds=(cfg["fd"], ))
            cmd = [sys.executable, "-m", "tests.harness.worker"]
            try:
                return subprocess.Popen(cmd, process_group=pgid, **args)
            except (OSError, subprocess.SubprocessError):
                if pgid == 0:
                    raise
                # Rank 0 is already gone, and its group with it; the handshake will report why.
                return subprocess.Popen(cmd, process_group=0, **args)

    def _handshake(self, deadline):
        pending = {r.conn: r for r in self._ranks}
        while pending:
            ready = multiprocessing.connection.wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                stuck = list(pending.values())
                self._dump_stacks(stuck)
                raise PoolStartError(self._start_report(
                    f"ranks {', '.join(str(r.rank) for r in stuck)} not ready after {self.start_timeout:g} s "
                    f"(ZERO3_POOL_START_TIMEOUT){self._stale_lock_hint()}", stuck))
            for conn in ready:
                r = pending[conn]
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    raise PoolStartError(self._start_report(
                        f"rank {r.rank} died while starting: {_exit_text(self._exitcode(r))}", [r])) from None
                if msg[0] == "port":
                    data = _dumps(msg)
                    for other in self._ranks[1:]:
                        _send(other.conn, data)
                elif msg[0] == "ready":
                    r.info = msg[1]
                    del pending[conn]
                else:
                    raise PoolStartError(self._start_report(
                        f"rank {r.rank} failed to start: {msg[2]}: {_first_line(msg[3])}\n{msg[4]}", [r]))

    def _start_report(self, headline, ranks):
        lines = [f"{self.name}: could not start {self.world_size} ranks ({self.device}/{self.backend}): {headline}"]
        for r in ranks:
            lines.append(f"===== rank {r.rank} log (last {LOG_TAIL_LINES} lines of {r.log_path}) =====")
            lines.append(_tail(r.log_path, 0).rstrip() or "(no output)")
        return "\n".join(lines)

    def _stale_lock_hint(self):
        ext_dir = Path(self._base_env()["TORCH_EXTENSIONS_DIR"])
        locks = sorted(str(p) for p in ext_dir.glob("*/lock"))
        if not locks:
            return ""
        return ("; a JIT build may be waiting on a lock left by a killed build: if no build is running, delete "
                + " ".join(locks))

    def _exitcode(self, r):
        try:
            return r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _dump_stacks(self, ranks):
        """Ask ranks about to be killed for their Python stacks (faulthandler writes them to the log)."""
        sent = False
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGUSR1)
                sent = True
        if sent:
            time.sleep(0.5)

    def _kill(self, graceful=False):
        ranks, self._ranks = self._ranks, []
        for r in ranks:
            r.conn.close()  # an idle rank exits by itself on EOF
        if graceful:
            deadline = time.monotonic() + 2.0
            for r in ranks:
                try:
                    r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for pgid in {r.pgid for r in ranks}:
            if isinstance(ranks[0].proc, _ForkedProc):
                ranks[0].proc.zygote.signal([r.proc.pid for r in ranks], signal.SIGKILL, pgid)
                continue
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    # ----- running ----------------------------------------------------------------------------------------------

    def run(self, target, /, *, timeout=None, grace=None, **kwargs):
        """Run ``target(**kwargs)`` on every rank and return the per-rank return values, in rank order.

        Raises ScenarioFailed when a rank raises, dies or hangs, and pytest's Skipped when a rank skips.
        """
        __tracebackhide__ = True
        outcome = self.execute(target, kwargs, timeout=timeout, grace=grace)
        if outcome.failed:
            raise ScenarioFailed(outcome)
        if outcome.skipped:
            import pytest
            pytest.skip(outcome.skip_message)
        return outcome.values

    def execute(self, target, kwargs=None, *, timeout=None, grace=None, sys_path=()):
        """Like run, but returns the RunOutcome (per-rank status, values, errors) instead of raising."""
        target = target_name(target)
        timeout = timeout if timeout is not None else env_float("ZERO3_TEST_TIMEOUT", 300.0)
        grace = grace if grace is not None else env_float("ZERO3_TEST_GRACE", 5.0)
        self._task_id += 1
        # Pickle before starting anything: an unpicklable argument is the caller's error, not a rank's.
        data = _dumps(("run", self._task_id, target, dict(kwargs or {}), list(sys_path)))
        self.start()
        ranks = list(self._ranks)
        offsets = {r.rank: _size(r.log_path) for r in ranks}
        outcomes = {}
        t0 = time.monotonic()
        pending = {}
        for r in ranks:
            try:
                _send(r.conn, data)
                pending[r.conn] = r
            except OSError:
                outcomes[r.rank] = RankOutcome(r.rank, "died", exitcode=self._exitcode(r), order=len(outcomes))
        deadline = t0 + timeout
        grace_deadline = t0 + grace if outcomes else None
        while pending:
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            ready = multiprocessing.connection.wait(list(pending), timeout=max(0.0, limit - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                r = pending.pop(conn)
                outcome = self._read_answer(r)
                outcome.order = len(outcomes)
                outcomes[r.rank] = outcome
                if outcome.status != "ok" and grace_deadline is None:
                    grace_deadline = time.monotonic() + grace
        elapsed = time.monotonic() - t0
        hung = list(pending.values())
        for r in hung:
            outcomes[r.rank] = RankOutcome(r.rank, "hung")
        self._dump_stacks(hung)
        for r in ranks:
            o = outcomes[r.rank]
            o.log_path = str(r.log_path)
            if o.status != "ok":
                o.log_tail = _tail(r.log_path, offsets[r.rank])
        result = RunOutcome(target, self.world_size, self.device, self.backend, timeout, grace, elapsed,
                            [outcomes[r.rank] for r in ranks])
        self.stats["runs"] += 1
        world.note_run(self.world_size)
        if any(o.status in ("error", "died", "hung") for o in result.ranks):
            # After a failure the ranks may disagree about which collectives ran: never reuse them.
            self._keep_logs = True
            self._kill()
        return result

    def _read_answer(self, r):
        try:
            msg = _recv(r.conn)
        except (EOFError, OSError):
            return RankOutcome(r.rank, "died", exitcode=self._exitcode(r))
        except Exception as e:
            return RankOutcome(r.rank, "error", error_type=type(e).__name__,
                               message=f"the rank's answer could not be unpickled here: {e}",
                               traceback=f"{type(e).__name__}: {e}")
        kind = msg[0]
        if kind == "ok":
            return RankOutcome(r.rank, "ok", value=msg[2])
        if kind == "skip":
            return RankOutcome(r.rank, "skip", message=msg[2])
        return RankOutcome(r.rank, "error", error_type=msg[2], message=msg[3], traceback=msg[4])


def _size(path):
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path, offset, lines=LOG_TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
