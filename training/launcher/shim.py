"""Worker stand-in that the elastic agent starts: asks the launcher's zygote for a warm worker.

Run as `python -S shim.py ARGV...` (no site import: ~15 ms), so it uses the standard library only and
imports nothing from the kit. The elastic agent starts it exactly as it would start the trainer (its
env, its log files, its own process group), and it forwards the request to the zygote, a process that
already imported torch and the trainer module, which forks the worker. To the agent the shim *is* the
worker:

- the worker gets the shim's environment, working directory, argv and stdin/stdout/stderr (the file
  descriptors are passed over the socket), so torchelastic's log redirection and error files work;
- signals the shim receives (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) go to the worker's
  process group; if the shim itself is SIGKILLed, the zygote sees the socket close and SIGKILLs the
  worker's group;
- the shim exits with the worker's exit status (killing itself with the same signal when the worker died
  of one, so the agent sees e.g. -9);
- with `KIT_RANK_RESTART=in-place` (the launcher's `--rank-restart in-place`), a worker that died of a crash
  signal is started again in place instead, with `KIT_REJOIN` set: the agent sees nothing, the group
  keeps running, and the new worker rejoins its peers' in-process restart (fsdpkit.resilience.inprocess).

Without a zygote (KIT_ZYGOTE_SOCKET unset or unreachable) the shim execs a normal interpreter with the
same argv: same pid, same process group, the stock torchrun behaviour.
"""

import contextlib
import json
import os
import signal
import socket
import struct
import sys

ZYGOTE_SOCKET_ENV = "KIT_ZYGOTE_SOCKET"
RANK_RESTART_ENV = "KIT_RANK_RESTART"
"""`in-place`: a worker killed by a crash signal is started again by its shim (`--rank-restart`)."""
RANK_RESTART_MAX_ENV = "KIT_RANK_RESTART_MAX"
REJOIN_ENV = "KIT_REJOIN"
"""Set for a worker started again in place: how many times its shim has done so."""
CRASH_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
ZYGOTE_SOCKET_NAME = "zygote.sock"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _exec_plain(argv: list[str]) -> None:
    os.environ.pop(ZYGOTE_SOCKET_ENV, None)
    os.execv(sys.executable, [sys.executable, *argv])


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


def _start(path: str, argv: list[str], env: dict[str, str]) -> socket.socket | None:
    """Ask the zygote for a worker; the connection it reports on, or None when it cannot be reached."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        return None
    body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "shim_pid": os.getpid()}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2])
    sock.sendall(body)
    return sock


def _wait(sock: socket.socket, stopping: list[bool]) -> int:
    """Forward signals to the worker until it exits; its exit code (negative: killed by that signal)."""
    reply = _read_line(sock)
    if not reply:
        print("kit-launch shim: the zygote closed the connection before starting the worker", file=sys.stderr)
        sys.exit(1)
    worker_pid = json.loads(reply)["pid"]

    def forward(signum: int, _frame: object) -> None:
        stopping[0] = True  # a stop asked of this rank: never started again in place
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker_pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    reply = _read_line(sock)
    if not reply:
        # The zygote went away: take the worker down with us, as a dead worker would.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker_pid, signal.SIGKILL)
        print("kit-launch shim: lost the zygote; worker killed", file=sys.stderr)
        sys.exit(1)
    return json.loads(reply)["exit"]


def _again_in_place(code: int, env: dict[str, str], restarts: int, stopping: bool) -> bool:
    """`--rank-restart in-place`: a worker that died of a crash signal (not a stop) is started again in
    this shim, up to KIT_RANK_RESTART_MAX times, and its peers (restarting in process) restore it from a
    live replica. Where rank 0 hosts the workers' stores (no shared agent store), its loss restarts the
    group instead."""
    shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if env.get(RANK_RESTART_ENV) != "in-place" or stopping or (env.get("RANK", "0") == "0" and not shared):
        return False
    return -code in CRASH_SIGNALS and restarts < int(env.get(RANK_RESTART_MAX_ENV, "3"))


def main() -> None:
    argv = sys.argv[1:]
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        _exec_plain(argv)
    env = {k: v for k, v in os.environ.items() if k != ZYGOTE_SOCKET_ENV}
    sock = _start(path, argv, env)
    if sock is None:
        _exec_plain(argv)
    stopping = [False]
    code = _wait(sock, stopping)
    restarts = 0
    while _again_in_place(code, env, restarts, stopping[0]):
        restarts += 1
        print(
            f"kit-launch shim: rank {env.get('RANK')}'s worker died of signal {-code}; starting it again in "
            f"place ({restarts}/{env.get(RANK_RESTART_MAX_ENV, '3')}): it rejoins its peers",
            file=sys.stderr,
            flush=True,
        )
        env[REJOIN_ENV] = str(restarts)
        sock = _start(path, argv, env)
        if sock is None:
            break
        code = _wait(sock, stopping)
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
