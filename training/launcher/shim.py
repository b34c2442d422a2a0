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
  of one, so the agent sees e.g. -9).

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


def main() -> None:
    argv = sys.argv[1:]
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        _exec_plain(argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        _exec_plain(argv)
    env = {k: v for k, v in os.environ.items() if k != ZYGOTE_SOCKET_ENV}
    body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "shim_pid": os.getpid()}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2])
    sock.sendall(body)
    reply = _read_line(sock)
    if not reply:
        print("kit-launch shim: the zygote closed the connection before starting the worker", file=sys.stderr)
        sys.exit(1)
    worker_pid = json.loads(reply)["pid"]

    def forward(signum: int, _frame: object) -> None:
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
    code = json.loads(reply)["exit"]
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
