"""Warm worker factory: a process that imported torch (and the trainer module) once, then forks workers.

A restart under torchrun re-spawns Python and re-imports torch: 2-2.6 s of the ~6 s recovery on the
2-core test machines (reference/torch-on-cpu.md §3.1). The launcher forks this zygote at start, before
it creates any thread or store; the elastic agent then starts `shim.py` instead of the trainer, and the
shim asks the zygote for a worker. A forked worker starts with torch and the trainer's imports already
in memory (copy-on-write), in its own session and process group, with the shim's env, cwd, argv and
stdio. This is the same fork-after-import-torch that DataLoader workers rely on.

Protocol on a Unix socket in a 0700 folder (peer uid checked):
  shim -> zygote: 4-byte length + fds [stdin, stdout, stderr] (SCM_RIGHTS), then a JSON body
                  {"argv", "env", "cwd", "shim_pid"}
  zygote -> shim: {"pid": WORKER_PID}\n, later {"exit": CODE}\n (negative = killed by that signal)
The zygote SIGKILLs a worker's process group when its shim disconnects (the agent killed the shim), and
every worker's group when the launcher goes away (EOF on a pipe).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

import psutil

from fsdpkit.launcher.shim import REJOIN_ENV, ZYGOTE_SOCKET_ENV, ZYGOTE_SOCKET_NAME
from fsdpkit.runtime import stacks
from fsdpkit.runtime.heartbeat import HeartbeatClient
from fsdpkit.runtime.process_exit import leave

SHIM_PATH = str(Path(__file__).with_name("shim.py"))


def worker_command(argv: list[str]) -> tuple[str, list[str]]:
    """The (entrypoint, args) the elastic agent runs to get a zygote worker for `python ARGV`."""
    return sys.executable, ["-S", SHIM_PATH, *argv]


def prewarm_modules(argv: list[str]) -> list[str]:
    """Modules worth importing in the zygote: torch's distributed stack and the `-m` module if any."""
    modules = [
        "torch",
        "torch.distributed",
        "torch.distributed.checkpoint",
        "torch.distributed.fsdp",
        "torch.distributed.checkpoint._fsspec_filesystem",
        # imported lazily by torch itself on first use (e.g. use_deterministic_algorithms, optimizers):
        # 0.7 s on the 2-core test machine if left to every restarted worker
        "torch._dynamo",
        "torch._inductor",
        "torch.optim",
        "numpy.random",
    ]
    argv = argv[1:] if argv[:1] == ["-u"] else argv
    if len(argv) >= 2 and argv[0] in ("-m", "--module"):
        modules += [argv[1], *_main_imports(argv[1])]
    return modules


def _main_imports(module: str) -> list[str]:
    """What a package's `__main__` imports (`python -m PACKAGE` runs it), read from its source without
    running it: importing the package alone would leave the trainer itself for every worker to import."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    for folder in spec.submodule_search_locations:
        try:
            tree = ast.parse(Path(folder, "__main__.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        return [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module]
    return []


class Zygote:
    """Launcher-side handle: forks the zygote now; `close()` (or the launcher's exit) ends it."""

    def __init__(self, folder: str | os.PathLike[str], *, prewarm: list[str]) -> None:
        self.socket_path = str(Path(folder) / ZYGOTE_SOCKET_NAME)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)  # bound before the fork: shims may connect at once
        listener.listen(64)
        alive_r, alive_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote
            os.close(alive_w)
            code = 0
            try:
                _Server(listener, alive_r, prewarm).serve()
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(alive_r)
        listener.close()
        self.pid = pid
        self._alive_w = alive_w

    @property
    def env(self) -> dict[str, str]:
        """Environment that sends the shim to this zygote."""
        return {ZYGOTE_SOCKET_ENV: self.socket_path}

    def live_workers(self) -> list[int]:
        """The pids of the workers this zygote forked that have not exited (a zombie has: its memory, a
        GPU's included, is freed)."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child.pid)
        return alive

    def wait_workers_gone(self, timeout_s: float) -> list[int]:
        """Wait up to `timeout_s` until every worker has exited; the pids of those that have not.

        The agent stops a group by stopping the shims; a SIGKILLed shim's worker is SIGKILLed by the
        zygote a moment later, and a big process takes a while to exit (a GPU worker frees its device
        memory on the way out). torchelastic waits for its own children before a restart; this is the
        same wait for the zygote's, so a new attempt never starts beside the old one."""
        deadline = time.monotonic() + timeout_s
        while (alive := self.live_workers()) and time.monotonic() < deadline:
            time.sleep(0.005)
        return alive

    def close(self, grace_s: float = 1.0) -> None:
        """End the zygote; it SIGKILLs any worker still running.

        A zygote still pre-importing has no worker and does not read its pipe yet: it is SIGKILLed
        after `grace_s` instead of holding the launcher's exit for the rest of its imports.
        """
        if self._alive_w < 0:
            return
        os.close(self._alive_w)
        self._alive_w = -1
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                    time.sleep(0.01)
                    continue
            break
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


class _Server:
    """The zygote's single-threaded loop: accept shims, fork workers, report their exits."""

    def __init__(self, listener: socket.socket, alive_r: int, prewarm: list[str]) -> None:
        self.listener = listener
        self.alive_r = alive_r
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        # Ctrl-C or a SIGTERM to the whole process group is the launcher's to handle (it stops the workers
        # gracefully); the zygote ends when the launcher closes its pipe or dies.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        self.pending: dict[int, socket.socket] = {}  # connections whose request is not read yet
        self.by_pid: dict[int, socket.socket] = {}  # running worker -> its shim's connection
        self.pid_by_fd: dict[int, int] = {}
        for module in prewarm:
            try:
                importlib.import_module(module)
            except Exception as exc:  # the worker will hit (and report) the same error itself
                print(f"kit-launch zygote: could not pre-import {module}: {exc}", file=sys.stderr)

    def serve(self) -> None:
        while True:
            fds = [self.listener, self.alive_r, self.wake_r, *self.pending.values(), *self.by_pid.values()]
            readable, _, _ = select.select(fds, [], [])
            for item in readable:
                if item is self.alive_r:
                    if not os.read(self.alive_r, 1):
                        self._kill_all()
                        return
                elif item is self.listener:
                    conn, _ = self.listener.accept()
                    self._check_peer(conn)
                elif item is self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 512)
                    self._reap()
                elif isinstance(item, socket.socket) and item.fileno() in self.pending:
                    self._spawn(self.pending.pop(item.fileno()))
                elif isinstance(item, socket.socket):
                    self._shim_gone(item)

    def _check_peer(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            conn.close()
            return
        self.pending[conn.fileno()] = conn

    def _spawn(self, conn: socket.socket) -> None:
        try:
            header, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
            (length,) = struct.unpack("!I", header)
            body = b""
            while len(body) < length:
                chunk = conn.recv(length - len(body))
                if not chunk:
                    raise ConnectionError("shim hung up")
                body += chunk
            request = json.loads(body)
        except (OSError, ValueError, struct.error) as exc:
            print(f"kit-launch zygote: bad request from a shim: {exc}", file=sys.stderr)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_worker(conn, fds, request)  # never returns
        for fd in fds:
            os.close(fd)
        self.by_pid[pid] = conn
        self.pid_by_fd[conn.fileno()] = pid
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the shim died since its request (killed as its group stopped): so does the worker
            self._shim_gone(conn)

    def _become_worker(self, conn: socket.socket, fds: list[int], request: dict) -> None:
        code = 1
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for sock in (self.listener, conn, *self.pending.values(), *self.by_pid.values()):
                sock.close()
            for fd in (self.alive_r, self.wake_r, self.wake_w):
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            if REJOIN_ENV in os.environ:  # started again in place: its rank's record says "start" at once,
                HeartbeatClient.from_env().phase("start")  # not the dead worker's stale "train"
            stacks.install()  # stacks on request: tells a hung rank from the peers that wait for it
            code = _run_python_argv(request["argv"])
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            leave(code)  # as an interpreter would, without unwinding the forked copy

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.by_pid.pop(pid, None)
            if conn is None:
                continue
            self.pid_by_fd.pop(conn.fileno(), None)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()

    def _shim_gone(self, conn: socket.socket) -> None:
        pid = self.pid_by_fd.pop(conn.fileno(), None)
        with contextlib.suppress(OSError):
            if conn.recv(1):
                return  # shims send nothing after the request; ignore noise
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # a worker not yet in its own group (setsid)
                os.kill(pid, signal.SIGKILL)
            self.by_pid.pop(pid, None)
        conn.close()

    def _kill_all(self) -> None:
        for pid in list(self.by_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(self.by_pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _run_python_argv(argv: list[str]) -> int:
    """Run `python ARGV` in this (already warm) interpreter: `[-u] -m MODULE ...` or `[-u] SCRIPT ...`."""
    if argv[:1] == ["-u"]:
        argv = argv[1:]
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if len(argv) >= 2 and argv[0] in ("-m", "--module"):
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv and not argv[0].startswith("-"):
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")
    else:
        raise SystemExit(
            f"kit-launch zygote: cannot run python {' '.join(argv)!r}; use -m MODULE or a script"
        )
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
