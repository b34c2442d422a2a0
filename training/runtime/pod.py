"""This pod's processes, and the two ways a whole pod ends that the node-level faults reproduce.

- `kill_pod`: every process of the pod SIGKILLed at once, as when its node is lost (Xid 79, kernel panic):
  all are frozen first (SIGSTOP), so none sees another die and reacts, then killed, this one last.
- `freeze_pod`: a node lost silently: every process of the pod SIGSTOPped (sockets open, nothing answers),
  then SIGKILLed after a while (a detached helper plays the node lifecycle controller).
- `drain_pod`: what the kubelet does on eviction: SIGTERM to the pod's main process, SIGKILL to what is left
  after the grace period (a small detached helper plays the kubelet's timer).

The pod is found from the environment the Job gives every container (POD_NAME, a fieldRef; the local
runner gives the same): its main process is the highest ancestor started with this POD_NAME (on EKS the
container's PID 1, locally the process the runner started), and the pod is that process and all its
descendants. Without POD_NAME (a launcher started by hand) the kit launcher's own pid stands in
(KIT_POD_ROOT_PID). Nothing outside that tree is ever signalled: a process is identified by pid and start
time, so a recycled pid is left alone. Standard library only: workers import it without torch's cost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from fsdpkit.contracts import env

POD_NAME_ENV = env.POD_NAME
POD_ROOT_ENV = env.POD_ROOT_PID
GRACE_ENV = env.GRACE_S
FREEZE_KILL_ENV = "KIT_FREEZE_KILL_S"
"""Seconds a frozen pod (the `freeze` fault) stays frozen before it is SIGKILLed."""
DEFAULT_FREEZE_KILL_S = 30.0
DEFAULT_GRACE_S = 30.0
"""Kubernetes' default terminationGracePeriodSeconds."""
PID1_EXIT_SIGNAL = signal.SIGUSR1
"""PID 1 of a container ignores SIGKILL sent from inside its namespace; the kit launcher, when it is PID 1,
exits at once (no cleanup) on this signal instead (training/launcher/cli.py)."""


class PodError(RuntimeError):
    """The pod's processes cannot be found; the message says why."""


def pod_index() -> int:
    """This pod's node index: the Job completion index, else the launcher's group rank, else 0."""
    for name in ("JOB_COMPLETION_INDEX", "GROUP_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _seconds_env(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if 0 <= value < float("inf") else default


def grace_period_s() -> float:
    """Seconds between SIGTERM and SIGKILL for this pod."""
    return _seconds_env(GRACE_ENV, DEFAULT_GRACE_S)


def freeze_kill_s() -> float:
    """Seconds a frozen pod stays frozen before it is SIGKILLed."""
    return _seconds_env(FREEZE_KILL_ENV, DEFAULT_FREEZE_KILL_S)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[1]), int(fields[19])


def _pod_name_of(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{POD_NAME_ENV}=".encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def pod_root() -> int:
    """The pod's main process (see the module docstring); PodError when it cannot be told."""
    name = os.environ.get(POD_NAME_ENV)
    if name:
        root = os.getpid()
        while True:
            stat = _stat(root)
            parent = stat[0] if stat else 0
            if parent <= 0 or _pod_name_of(parent) != name:
                return root
            root = parent
    fallback = os.environ.get(POD_ROOT_ENV, "")
    if fallback.isdigit() and _stat(int(fallback)) is not None:
        return int(fallback)
    raise PodError(
        f"node-level faults need {POD_NAME_ENV} (set by the Job and the local runner) or the kit launcher's "
        f"{POD_ROOT_ENV}; run under the launcher or set {POD_NAME_ENV}"
    )


def pod_processes(root: int) -> dict[int, int]:
    """pid -> start time of the root and every descendant, now."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents[int(entry)] = stat
    members = {root} if root in parents else set()
    grew = True
    while grew:
        grew = False
        for pid, (parent, _) in parents.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    return {pid: parents[pid][1] for pid in members}


def _signal(pid: int, started: int, sig: signal.Signals) -> None:
    stat = _stat(pid)
    if stat is None or stat[1] != started:
        return  # gone, or its pid now belongs to someone else
    if pid == 1:
        if sig == signal.SIGSTOP:
            return
        if sig == signal.SIGKILL:
            sig = PID1_EXIT_SIGNAL
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _this_pod(doing: str) -> dict[int, int]:
    """pid -> start time of this pod's processes; {} (said on stderr) when the pod cannot be found, so that
    the fault acts on this process only."""
    try:
        return pod_processes(pod_root())
    except PodError as exc:
        print(f"[fault] {exc}; {doing} this process only", file=sys.stderr, flush=True)
        return {}


def kill_pod() -> None:
    """SIGKILL the whole pod at once; does not return."""
    me = os.getpid()
    others = {pid: t for pid, t in _this_pod("killing").items() if pid != me}
    for pid, started in others.items():
        _signal(pid, started, signal.SIGSTOP)
    for pid, started in others.items():
        _signal(pid, started, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def freeze_pod(kill_after_s: float) -> None:
    """SIGSTOP the whole pod (this process last) and SIGKILL it `kill_after_s` later; returns only if this
    process is woken (SIGCONT) before then.

    A pod's PID 1 is left running (a container's PID 1 ignores SIGSTOP sent from inside it): on EKS the
    freeze stops every process but the launcher."""
    me = os.getpid()
    members = _this_pod("freezing")
    if me not in members and (stat := _stat(me)) is not None:
        members[me] = stat[1]
    _spawn_killer(kill_after_s, members, wait_for_exit=False)
    for pid, started in members.items():
        if pid != me:
            _signal(pid, started, signal.SIGSTOP)
    os.kill(me, signal.SIGSTOP)


def _spawn_killer(after_s: float, members: dict[int, int], *, wait_for_exit: bool) -> None:
    """A detached helper that SIGKILLs `members` (pid -> start time) after `after_s`, or as soon as all are
    gone when `wait_for_exit` (a drain's grace period)."""
    subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-c",
            _KUBELET,
            f"{after_s:g}",
            "1" if wait_for_exit else "0",
            *(f"{p}:{t}" for p, t in members.items()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the pod's processes it may have to kill
        close_fds=True,
    )


_KUBELET = """
import os, signal, sys, time
grace, early = float(sys.argv[1]), sys.argv[2] == '1'
members = [tuple(map(int, m.split(':'))) for m in sys.argv[3:]]
def alive(pid, started):
    try:
        text = open(f'/proc/{pid}/stat').read()
    except OSError:
        return False
    fields = text.rpartition(')')[2].split()
    return int(fields[19]) == started and fields[0] != 'Z'
deadline = time.monotonic() + grace
while time.monotonic() < deadline and (not early or any(alive(*m) for m in members)):
    time.sleep(0.1)
for pid, started in members:
    if alive(pid, started):
        try:
            os.kill(pid, signal.SIGUSR1 if pid == 1 else signal.SIGKILL)
        except OSError:
            pass
"""


def drain_pod(grace_s: float) -> None:
    """SIGTERM the pod's main process now and SIGKILL what is left of the pod after `grace_s`; returns.

    Outside a container the pod is a process group (the local runner's, as its own stop does), so the
    SIGTERM goes to the main process's group: launchers run inside sh wrappers get it too."""
    root = pod_root()
    _spawn_killer(grace_s, pod_processes(root), wait_for_exit=True)
    if root == 1:
        os.kill(1, signal.SIGTERM)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(root), signal.SIGTERM)
