"""Main of the processes of a RankPool: ``python -m tests.harness.worker`` (started by the pool only).

Life of a rank: tie its life to the parent's, import DeepSpeed once, join the process group once, then run
tasks sent by the parent until the parent closes the pipe. Everything it prints goes to its log file.
Ranks are forked from a "zygote" (the same module, in zygote mode) that has imported DeepSpeed already.
"""

import contextlib
import ctypes
import faulthandler
import importlib
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from multiprocessing.connection import Connection

from tests.harness import context

PR_SET_PDEATHSIG = 1

# Rank 0's rendezvous server; it must stay referenced for the life of the process group.
_store = None


def _send(conn, msg):
    # Plain pickle, not Connection.send: torch registers reducers with multiprocessing's ForkingPickler that
    # turn CPU tensors into shared-memory handles, which mean nothing to the parent over a socket.
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _die_with_parent(parent_pid):
    """Make sure this rank never outlives the pytest process, even when that one is SIGKILLed."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    # The parent may have died before prctl took effect; and PDEATHSIG does not exist off Linux.
    if os.getppid() != parent_pid:
        os._exit(70)

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(70)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _resolve(target):
    """'pkg.module:func' or 'pkg.module:Class.method' (the class is instantiated without arguments)."""
    module_name, _, qualname = target.partition(":")
    obj = importlib.import_module(module_name)
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        obj = getattr(obj, part)
        if isinstance(obj, type) and i < len(parts) - 1:
            obj = obj()
    return obj


def _format_scenario_traceback(exc):
    # Start at the scenario's frame: the harness's own frames above it only add noise to every report.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == __name__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _safe_str(exc):
    try:
        return str(exc)
    except Exception:
        return repr(type(exc))


def _is_skip(exc):
    # pytest.skip raises _pytest.outcomes.Skipped; a scenario that skipped has imported pytest, so a rank that
    # never skips never pays for importing it.
    outcomes = sys.modules.get("_pytest.outcomes")
    return outcomes is not None and isinstance(exc, outcomes.Skipped)


def _start(conn, cfg):
    global _store
    rank, world_size = cfg["rank"], cfg["world_size"]
    t0 = time.monotonic()
    if cfg["set_dist_env"]:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          MASTER_ADDR="127.0.0.1")
        if rank == 0:
            # Rank 0 binds the rendezvous store on a port the kernel picks (port 0), so two concurrent runs can
            # never race for the same port; the parent relays the port to the other ranks, and torch's
            # "agent store" mode makes every rank (rank 0 too) a client of this already running server.
            from torch.distributed import TCPStore
            _store = TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False)
            port = _store.port
            _send(conn, ("port", port))
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    t_import = time.monotonic() - t0
    if cfg["set_dist_env"]:
        if rank != 0:
            msg = _recv(conn)
            assert msg[0] == "port", msg
            port = msg[1]
        os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    if cfg["device"] == "cpu" and not cfg["shm_op"]:
        from tests.harness.gloo import skip_shm_op_build
        skip_shm_op_build()
    if cfg["device"] == "cuda":
        get_accelerator().set_device(rank)
    if cfg["init_distributed"]:
        deepspeed.init_distributed(dist_backend=cfg["backend"])
        deepspeed.comm.barrier()
        if cfg["device"] == "cpu":
            from tests.harness.gloo import dealias_gloo_collectives
            dealias_gloo_collectives()
    context._set(context.RankContext(rank, rank, world_size, cfg["device"], cfg["backend"]))
    info = dict(pid=os.getpid(), import_s=round(t_import, 3), start_s=round(time.monotonic() - t0, 3),
                deepspeed=deepspeed.__version__, deepspeed_file=deepspeed.__file__,
                accelerator=get_accelerator().device_name(), accelerator_available=get_accelerator().is_available())
    _send(conn, ("ready", info))


def _run_task(target, kwargs, sys_path):
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    fn = _resolve(target)
    return fn(**kwargs)


def _serve(conn):
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return  # the parent closed the pipe: the pool is being shut down
        _, task_id, target, kwargs, sys_path = msg
        print(f"[harness] task {task_id}: {target}", flush=True)
        environ, cwd = dict(os.environ), os.getcwd()
        try:
            result = _run_task(target, kwargs, sys_path)
            try:
                reply = pickle.dumps(("ok", task_id, result), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise TypeError(f"the scenario's return value cannot be pickled: {e!r}") from e
        except BaseException as e:  # noqa: B902 - a scenario's SystemExit or pytest.fail must be reported too
            if _is_skip(e):
                reply = ("skip", task_id, str(getattr(e, "msg", e)))
            else:
                # The full traceback goes to the parent's report; the log gets one line to mark the spot.
                reply = ("error", task_id, type(e).__name__, _safe_str(e), _format_scenario_traceback(e))
            print(f"[harness] task {task_id} ended with {type(e).__name__}", flush=True)
            reply = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            # Scenarios share the process: undo the cheap kinds of leakage between them.
            if os.getcwd() != cwd:
                os.chdir(cwd)
            if os.environ != environ:
                os.environ.clear()
                os.environ.update(environ)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send_bytes(reply)


def _rank_main(conn, cfg):
    _die_with_parent(cfg["parent"])
    faulthandler.enable()
    # The pool sends SIGUSR1 to a rank it is about to kill for hanging: the Python stacks land in the log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        _start(conn, cfg)
    except BaseException as e:  # noqa: B902
        traceback.print_exc()
        try:
            _send(conn, ("error", None, type(e).__name__, _safe_str(e), traceback.format_exc()))
        except OSError:
            pass
        sys.stdout.flush()
        os._exit(1)
    _serve(conn)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: process-group and thread-pool destructors can block, and nothing needs it.
    os._exit(0)


def _become_rank(fd, cfg, env, log_path):
    """In a child just forked by the zygote: take on a rank process's identity, then run as one."""
    try:
        os.setpgid(0, cfg["pgid"])
    except OSError:
        os.setpgid(0, 0)  # the group's leader (rank 0) is already gone; the pool will see why
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(env)
    import torch
    # Spawned ranks would each start from fresh random state; forked ones inherit the zygote's.
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if cfg["device"] == "cpu" and env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    _rank_main(Connection(fd), dict(cfg, fd=fd, parent=os.getppid()))


@contextlib.contextmanager
def _device_queries_from_nvml(torch):
    """On a CUDA host, answer torch.cuda's device queries from NVML for the duration of the block.

    DeepSpeed's import asks them: git_version_info.py runs every op builder's is_compatible(), several of
    which read ``torch.cuda.get_device_properties(0).major``, and ds_transformer.py asks
    ``get_device_capability()``. Through torch they initialize CUDA, and ranks forked afterwards could not use
    the GPU. NVML gives the same answers without touching the CUDA driver. Where NVML cannot answer, torch
    does, and the zygote reports CUDA as initialized (the pool then spawns its ranks).
    """
    if os.environ.get("DS_ACCELERATOR") != "cuda":
        yield
        return
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # no NVML bindings or no driver: leave torch alone
        yield
        return
    real_capability, real_properties = torch.cuda.get_device_capability, torch.cuda.get_device_properties

    def handle(device):
        index = 0 if device is None else int(device)  # a torch.device or a MIG id raises: torch answers
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        name = visible[index] if visible else str(index)
        return pynvml.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit() else \
            pynvml.nvmlDeviceGetHandleByUUID(name)

    def get_device_capability(device=None):
        try:
            return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle(device)))
        except Exception:
            return real_capability(device)

    def get_device_properties(device=None):
        try:
            h = handle(device)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            name = pynvml.nvmlDeviceGetName(h)
            return types.SimpleNamespace(major=major, minor=minor,
                                         name=name.decode() if isinstance(name, bytes) else name,
                                         total_memory=pynvml.nvmlDeviceGetMemoryInfo(h).total)
        except Exception:
            return real_properties(device)

    torch.cuda.get_device_capability, torch.cuda.get_device_properties = get_device_capability, get_device_properties
    try:
        yield
    finally:
        torch.cuda.get_device_capability, torch.cuda.get_device_properties = real_capability, real_properties


def _zygote(conn):
    """Import torch and DeepSpeed once, then fork ranks on request.

    A forked rank starts in well under a second where a spawned one spends seconds importing DeepSpeed (on a
    CUDA host, with its CUDA libraries, 15 s or more), which matters because a pool is restarted after every
    failed run and every upstream-style test class starts one. Forking is safe on CUDA only while this process
    has not initialized CUDA: the pool runs it with PYTORCH_NVML_BASED_CUDA_CHECK=1, so that DeepSpeed's
    "is CUDA available" checks ask NVML instead of the CUDA driver, and it reports whether torch initialized
    CUDA anyway; the pool then spawns its ranks instead.
    """
    from multiprocessing.reduction import recv_handle
    t0 = time.monotonic()
    import torch
    import torch.distributed  # noqa: F401
    with _device_queries_from_nvml(torch):
        import deepspeed
        import deepspeed.comm  # noqa: F401
        from deepspeed.accelerator import get_accelerator
        get_accelerator()
    _send(conn, ("ready",
                 dict(pid=os.getpid(), import_s=round(time.monotonic() - t0, 3),
                      cuda_initialized=torch.cuda.is_initialized())))
    children, exited = set(), {}

    def reap():
        while children - exited.keys():
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exited[pid] = os.waitstatus_to_exitcode(status)

    while True:
        reap()
        try:
            if not conn.poll(0.1):
                continue
            msg = _recv(conn)
        except (EOFError, OSError):
            break
        kind = msg[0]
        if kind == "fork":
            _, cfg, env, log_path = msg
            fd = recv_handle(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    conn.close()
                    _become_rank(fd, cfg, env, log_path)
                finally:
                    os._exit(1)
            os.close(fd)
            children.add(pid)
            _send(conn, ("forked", pid))
        elif kind == "exitcode":
            reap()
            _send(conn, ("exitcode", exited.get(msg[1])))
        elif kind == "signal":
            # Signals go through here because only the parent can tell a live child from a reaped pid that the
            # system may already have handed to an unrelated process.
            _, pids, sig, pgid = msg
            reap()
            if pgid in children and pgid not in exited:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
            for pid in pids:
                if pid in children and pid not in exited:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            _send(conn, ("signalled", ))
    for pid in children - exited.keys():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


def main():
    cfg = json.loads(os.environ.pop("ZERO3_HARNESS_CONFIG"))
    conn = Connection(cfg["fd"])
    if cfg.get("zygote"):
        _die_with_parent(cfg["parent"])
        _zygote(conn)
    else:
        _rank_main(conn, cfg)


if __name__ == "__main__":
    main()
