"""Run a rendered `local`-profile Job on this machine: each pod as a local process, as the cluster would.

The runner reads the Job manifest, not the values, so the container command line that EKS runs is the one
that is tested here. For every completion index it builds the environment the kubelet and Job controller
would give (JOB_COMPLETION_INDEX, HOSTNAME, fieldRef env such as NODE_RANK and POD_NAME, `$(VAR)`
expansion), maps each volume mount to a local folder (the mount path is substituted in argv, env and the
ConfigMap files), points MASTER_ADDR and the rendezvous endpoint at 127.0.0.1 on a free port, and then
applies the Job's own failure rules: exit 78 fails the Job, other failures replace the pod up to
`backoffLimitPerIndex`, and any index that runs out fails the Job (`maxFailedIndexes: 0`). A lost pod
(the `node` fault: the pod's main process SIGKILLed, exit -9) is replaced at once by default, the best case
of the Kubernetes path; `lost_pod_replace_after_s` delays that replacement. On EKS a lost node's pod is
only replaced once the node controller has marked the node unreachable (node-monitor grace period, 40 s by
default) and evicted it (the unreachable toleration, 300 s by default), on another node; started at once
on a single machine, its start-up (a launcher and a zygote importing torch) takes the very cores that the
surviving pods and a spare recover on, which a cluster never does.

The kit's rendezvous store (a Deployment) runs first, as a pod of its own: its Service name and port are
pointed at 127.0.0.1 and the same free port. It is stopped after the Job's pods.

KIND=jobset and KIND=trainjob run the same way from their own objects (fsdpkit.k8s.local_kinds): the
JobSet's `node` Job is the trainers' Job (hostnames `<set>-node-0-<index>`, which MASTER_ADDR names), its
`rdzv` Job the store, started first and waited for until Ready (`dependsOn`), replaced up to its
`backoffLimit`; a failed child Job (FailJob, an index or the store out of retries) fails the run through the
JobSet's failurePolicy rules, and nothing restarts the set (maxRestarts 0).

Nothing of a local run is on the machine's network: every listener binds 127.0.0.1 (the rendezvous store
`--host 127.0.0.1`; the workers' and in-process stores through KIT_LOCAL_ADDR, the address the launchers
advertise; gloo's pair sockets on the loopback interface, GLOO_SOCKET_IFNAME=lo), and each run has a fresh
token (the run's Secret on EKS) in a 0600 file that KIT_RUN_TOKEN_FILE names in every pod.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from fsdpkit.contracts import env as kit_env
from fsdpkit.contracts.ports import LOCAL_HOST, free_port_run
from fsdpkit.k8s.kinds import NODE_JOB, STORE_JOB
from fsdpkit.k8s.local_kinds import LocalRunError, SetPolicy, workload
from fsdpkit.k8s.render import Manifest
from fsdpkit.k8s.spec import INDEX_ANNOTATION

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else None
"""The repository when the kit runs from a checkout: the pods start there, with it on PYTHONPATH (as the
image's WORKDIR and code; examples/, bench/ and tests/ import from it). None when the kit is an installed
wheel: the pods start in the caller's folder, as a user's `kit-job local` from their project expects."""
LAUNCHER_PREFIX = "kit-launch: "
"""How the kit launcher's lines begin: the last one of a pod that failed the Job says why."""
PUMP_DRAIN_S = 5.0
"""Longest wait for an exited pod's last lines to reach its log (a child that still holds the pipe)."""
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class _Failed(Exception):
    """The run failed (the Job's rules, or a JobSet's); its message is the run's one-line reason."""


@dataclass
class PodRecord:
    """One local "pod": an attempt at one completion index."""

    name: str
    index: int
    attempt: int
    log: Path
    exit_code: int | None = None


@dataclass
class LocalResult:
    """Outcome of a local Job run."""

    succeeded: bool
    reason: str
    run_dir: Path
    pods: list[PodRecord] = field(default_factory=list)


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names are replaced, `$$` escapes, unknown references stay."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(repl, text)


class PathMap:
    """Mount path -> local folder; replaces whole path prefixes only (`/fsx/runs` yes, `/fsxx` no)."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        self.mounts = dict(sorted(mounts.items(), key=lambda kv: -len(kv[0])))
        alts = "|".join(re.escape(p.rstrip("/")) for p in self.mounts)
        self._re = re.compile(rf"(?<![\w.\-/])({alts})(?=/|$|[^\w.\-])") if alts else None

    def __call__(self, text: str) -> str:
        if self._re is None:
            return text
        return self._re.sub(lambda m: str(self.mounts[m.group(1)]), text)


def free_port() -> int:
    """A TCP port free now, with the next two free too (the NVRx backend's stores):
    fsdpkit.contracts.ports."""
    try:
        return free_port_run()
    except OSError as exc:
        raise LocalRunError(str(exc)) from None


@dataclass(frozen=True)
class LocalJob:
    """What the runner takes from the manifests."""

    name: str
    completions: int
    backoff_limit_per_index: int
    fail_job_codes: frozenset[int]
    grace_s: float
    container: dict[str, Any]
    pod_meta: dict[str, Any]
    namespace: str
    volumes: dict[str, dict[str, Any]]
    configmaps: dict[str, dict[str, str]]
    store: dict[str, Any] | None = None
    """The rendezvous store's container (from its Deployment), or None (the baselines: pod 0 hosts it)."""
    store_host: str = ""
    """The store Service's DNS name, as the pods' command line names it."""
    store_pod: str = ""
    """The store pod's name without its attempt suffix."""
    store_backoff_limit: int | None = None
    """Store pods its Job may replace (KIND=jobset/trainjob); None: a Deployment recreates it every time."""
    store_first: bool = False
    """The trainers start once the store's pod is Ready (a JobSet's `dependsOn: rdzv Ready`)."""
    max_failed_indexes: int | None = None
    """The Job's maxFailedIndexes: whether an index out of retries fails it at once (its failure reason)."""
    set_policy: SetPolicy | None = None
    """The JobSet's failure rules (KIND=jobset/trainjob); None for a plain Job."""


def load_job(manifests: list[Manifest]) -> LocalJob:
    """The trainers' Job of any KIND, its store and ConfigMaps; LocalRunError unless `local`-profile."""
    work = workload([m.obj for m in manifests])
    job = work.job
    labels = job["metadata"].get("labels", {})
    if labels.get("kit.io/profile") != "local":
        raise LocalRunError(
            f"the local runner runs PROFILE=local manifests; these are for {labels.get('kit.io/profile')!r} "
            "(use 'python -m fsdpkit.k8s apply' for EKS)"
        )
    spec = job["spec"]
    pod = spec["template"]["spec"]
    fail_codes: set[int] = set()
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes", {})
        if rule["action"] == "FailJob" and codes.get("operator") == "In":
            fail_codes.update(codes["values"])
    return LocalJob(
        store=work.store,
        store_host=work.store_host,
        store_pod=work.store_pod,
        store_backoff_limit=work.store_backoff_limit,
        store_first=work.store_first,
        max_failed_indexes=spec.get("maxFailedIndexes"),
        set_policy=work.policy,
        name=job["metadata"]["name"],
        completions=int(spec["completions"]),
        backoff_limit_per_index=int(spec.get("backoffLimitPerIndex", 0)),
        fail_job_codes=frozenset(fail_codes),
        grace_s=float(pod.get("terminationGracePeriodSeconds", 30)),
        container=pod["containers"][0],
        pod_meta=spec["template"]["metadata"],
        namespace=job["metadata"].get("namespace", "default"),
        volumes={v["name"]: v for v in pod.get("volumes", [])},
        configmaps={
            m.obj["metadata"]["name"]: m.obj.get("data", {})
            for m in manifests
            if m.obj["kind"] == "ConfigMap"
        },
    )


class LocalRunner:
    """Runs a LocalJob's pods as process groups under `workdir`; see the module docstring."""

    def __init__(
        self,
        job: LocalJob,
        *,
        workdir: Path,
        volume_root: Path | None = None,
        python: str = sys.executable,
        on_line: Callable[[str], None] | None = None,
        lost_pod_replace_after_s: float = 0.0,
    ) -> None:
        self.job = job
        self.lost_pod_replace_after_s = lost_pod_replace_after_s
        self.workdir = workdir.resolve()
        self.volume_root = (volume_root or self.workdir / "volumes").resolve()
        self.python = python
        self.on_line = on_line
        self.port = free_port()
        self.token_file = self._write_token()
        self.paths = self._prepare_volumes()
        shm = kit_env.SHM if os.path.isdir(kit_env.SHM) else None
        self.memory_root = Path(tempfile.mkdtemp(prefix="kit-local-", dir=shm))
        """Each pod's own memory (its /dev/shm on EKS): the launcher's memory-tier folder goes under it,
        and it goes with the pod."""
        self.pods: list[PodRecord] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._pumps: dict[str, threading.Thread] = {}
        """Pod name -> the thread copying its output to its log (done once the pod's pipe is drained)."""
        self._store: subprocess.Popen[bytes] | None = None
        self._store_starts = 0
        self._failures: dict[int, int] = {}
        """Index -> its failed pods, counted against backoffLimitPerIndex."""
        self._lock = threading.Lock()

    # -- volumes
    def _write_token(self) -> Path:
        """A fresh run token (32 random bytes as hex) in a file only this user can read: the run's Secret."""
        folder = self.workdir / "run-token"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / "token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(32) + "\n")
        return path

    def _prepare_volumes(self) -> PathMap:
        mounts: dict[str, Path] = {}
        env = self._static_env()
        for mount in self.job.container.get("volumeMounts", []):
            vol = self.job.volumes[mount["name"]]
            target = mount["mountPath"]
            if "persistentVolumeClaim" in vol:
                local = self.volume_root / vol["persistentVolumeClaim"]["claimName"]
            elif "configMap" in vol:
                local = self.workdir / "configmaps" / vol["configMap"]["name"]
            elif "secret" in vol:  # the run's token Secret, the only one the kit mounts: this run's file
                local = self.token_file.parent
            elif "emptyDir" in vol:
                if target == "/dev/shm":
                    continue  # this machine's own /dev/shm plays the memory-backed volume
                local = self.workdir / "emptydir" / vol["name"]
            else:
                raise LocalRunError(f"volume {vol['name']!r} has a type the local runner does not emulate")
            local.mkdir(parents=True, exist_ok=True)
            mounts[target] = local
        paths = PathMap(mounts)
        for mount in self.job.container.get("volumeMounts", []):
            vol = self.job.volumes[mount["name"]]
            if "configMap" in vol:
                data = self.job.configmaps.get(vol["configMap"]["name"])
                if data is None:
                    raise LocalRunError(f"ConfigMap {vol['configMap']['name']!r} is not among the manifests")
                folder = mounts[mount["mountPath"]]
                for key, text in data.items():
                    (folder / key).write_text(self._rewrite(paths(text), env), encoding="utf-8")
        return paths

    # -- environment
    def _static_env(self) -> dict[str, str]:
        env = {e["name"]: e["value"] for e in self.job.container.get("env", []) if "value" in e}
        return env

    def _rewrite(self, text: str, static_env: dict[str, str]) -> str:
        """Point the cluster's rank-0 address at 127.0.0.1 and its port at this run's free port."""
        addr, port = static_env.get("MASTER_ADDR"), static_env.get("MASTER_PORT")
        if self.job.store_host and port:
            text = text.replace(f"{self.job.store_host}:{port}", f"127.0.0.1:{self.port}")
        if addr and port:
            text = text.replace(f"{addr}:{port}", f"127.0.0.1:{self.port}")
            text = re.sub(rf"(--master-port=){re.escape(port)}\b", rf"\g<1>{self.port}", text)
        if addr:
            text = text.replace(addr, "127.0.0.1")
        return text

    def pod_env(self, index: int, pod_name: str) -> dict[str, str]:
        """The env the kubelet would give pod `index`, with local paths and addresses."""
        hostname = f"{self.job.name}-{index}"
        annotations = {**self.job.pod_meta.get("annotations", {}), INDEX_ANNOTATION: str(index)}
        fields = {
            "metadata.name": pod_name,
            "metadata.namespace": self.job.namespace,
            "status.podIP": "127.0.0.1",
            "spec.nodeName": socket.gethostname(),
            **{f"metadata.annotations['{k}']": v for k, v in annotations.items()},
            **{f"metadata.labels['{k}']": v for k, v in self.job.pod_meta.get("labels", {}).items()},
        }
        static = self._static_env()
        env: dict[str, str] = {
            "JOB_COMPLETION_INDEX": str(index),  # the Job controller adds it to every container
            "HOSTNAME": hostname,
        }
        for entry in self.job.container.get("env", []):
            name = entry["name"]
            if "value" in entry:
                env[name] = self.paths(self._rewrite(expand_vars(entry["value"], env), static))
            else:
                ref = entry["valueFrom"].get("fieldRef", {}).get("fieldPath")
                if ref not in fields:
                    raise LocalRunError(f"env {name}: valueFrom {entry['valueFrom']} is not emulated locally")
                env[name] = fields[ref]
        if "MASTER_PORT" in env:
            env["MASTER_PORT"] = str(self.port)
        env[kit_env.RUN_TOKEN_FILE] = str(self.token_file)
        env[kit_env.LOCAL_ADDR] = LOCAL_HOST  # the address the launchers advertise and the stores bind
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's pair sockets on the loopback interface only
        return env

    def pod_argv(self, env: dict[str, str]) -> list[str]:
        """The container's command and args after `$(VAR)` expansion and path mapping."""
        raw = list(self.job.container.get("command", [])) + list(self.job.container.get("args", []))
        static = self._static_env()
        argv = [self.paths(self._rewrite(expand_vars(a, env), static)) for a in raw]
        if not argv:
            raise LocalRunError("the container has no command; the local runner needs the launcher argv")
        if argv[0] in ("python", "python3"):
            argv[0] = self.python
        else:
            found = shutil.which(
                argv[0], path=f"{Path(self.python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            )
            if found is None:
                raise LocalRunError(f"{argv[0]} (the container's launcher) is not installed on this machine")
            argv[0] = found
        return argv

    def _host_env(self) -> dict[str, str]:
        """What a container image provides besides the pod env: PATH, HOME, locale, the code on PYTHONPATH."""
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "TERM")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        # The image puts its venv first on PATH; here this interpreter's folder plays it, so a `python`
        # inside the command (the exit-78 wrappers) is the one with torch, as in the container.
        env["PATH"] = os.pathsep.join(filter(None, [str(Path(self.python).parent), env.get("PATH", "")]))
        code = [str(CHECKOUT) if CHECKOUT else "", os.environ.get("PYTHONPATH", "")]
        if path := os.pathsep.join(filter(None, code)):
            env["PYTHONPATH"] = path
        return env

    # -- running
    def _start_store(self) -> None:
        """The rendezvous store's pod: its container's command with the local port, in its own group."""
        if self.job.store is None:
            return
        attempt = self._store_starts
        self._store_starts += 1
        name = f"{self.job.store_pod}-local" + (f"-r{attempt}" if attempt else "")
        record = PodRecord(name=name, index=-1, attempt=attempt, log=self.workdir / "logs" / f"{name}.log")
        record.log.parent.mkdir(parents=True, exist_ok=True)
        raw = list(self.job.store.get("command", [])) + list(self.job.store.get("args", []))
        argv = [re.sub(r"^--port=\d+$", f"--port={self.port}", a) for a in raw]
        argv[0] = self.python if argv[0] in ("python", "python3") else argv[0]
        argv = [a for a in argv if not a.startswith("--host=")] + [f"--host={LOCAL_HOST}"]
        argv.append("--exit-with-parent")  # a runner killed outright must not leave its store serving
        self._store = self._popen(argv, self._host_env(), record)

    def _restart_store_if_gone(self) -> bool:
        """The store's Deployment recreates its pod when it ends (same Service: here, the same port); a
        JobSet's `rdzv` Job replaces a failed one up to its backoffLimit, then fails (_Failed)."""
        if self._store is None or (code := self._store.poll()) is None:
            return False
        limit = self.job.store_backoff_limit
        if limit is None:
            print(f"rendezvous store pod exited (code {code}); its Deployment recreates it", flush=True)
        elif code == 0:  # its Job completed: nothing replaces it (the store only exits 0 when stopped)
            print("rendezvous store pod exited (code 0); its Job completed", flush=True)
            self._store = None
            return True
        elif self._store_starts > limit:
            raise _Failed(
                f"the rendezvous store's Job failed {self._store_starts} times (backoffLimit {limit}); "
                f"last exit code {code}" + self._set_outcome(STORE_JOB, "BackoffLimitExceeded")
            )
        else:
            print(f"rendezvous store pod exited (code {code}); its Job replaces it", flush=True)
        self._start_store()
        return True

    def _await_store(self, deadline: float | None) -> None:
        """`dependsOn: rdzv Ready`: the trainers' Job is created once the store's pod is Ready, which its
        readinessProbe (a TCP connect to its port, here this run's port) says."""
        if self._store is None or not self.job.store_first:
            return
        while True:
            with contextlib.suppress(OSError), socket.create_connection((LOCAL_HOST, self.port), timeout=1):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise _Failed("timed out waiting for the rendezvous store's pod to be Ready (dependsOn)")
            if not self._restart_store_if_gone():
                time.sleep(0.1)

    def _set_outcome(self, rjob: str, reason: str) -> str:
        """What the JobSet's failurePolicy makes of its child Job's failure ('' for a plain Job)."""
        return "" if self.job.set_policy is None else self.job.set_policy.outcome(rjob, reason)

    def _popen(self, argv: list[str], env: dict[str, str], record: PodRecord) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            cwd=str(CHECKOUT or Path.cwd()),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a pod is a process group; stopping it reaches every child
        )
        pump = threading.Thread(target=self._pump, args=(proc, record), daemon=True)
        self._pumps[record.name] = pump
        pump.start()
        return proc

    def _start(self, index: int, attempt: int) -> PodRecord:
        suffix = "local" if attempt == 0 else f"local-r{attempt}"
        name = f"{self.job.name}-{index}-{suffix}"
        record = PodRecord(name=name, index=index, attempt=attempt, log=self.workdir / "logs" / f"{name}.log")
        record.log.parent.mkdir(parents=True, exist_ok=True)
        host, pod = self._host_env(), self.pod_env(index, name)
        env = {**host, **pod, kit_env.TIER_BASE: str(self._pod_memory(name))}
        if "PYTHONPATH" in pod:  # the pod's ENV.PYTHONPATH first, the checkout (when there is one) after it
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [pod["PYTHONPATH"], host.get("PYTHONPATH", "")]))
        proc = self._popen(self.pod_argv(env), env, record)
        with self._lock:
            self._procs[index] = proc
            self.pods.append(record)
        return record

    def _pod_memory(self, name: str) -> Path:
        folder = self.memory_root / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _free_pod_memory(self, record: PodRecord) -> None:
        """A pod that ended takes its memory with it (a node lost, drained or done): nothing of it is left
        for its replacement."""
        shutil.rmtree(self.memory_root / record.name, ignore_errors=True)

    def _pump(self, proc: subprocess.Popen[bytes], record: PodRecord) -> None:
        with open(record.log, "wb") as log:
            for line in proc.stdout or ():
                log.write(line)
                log.flush()
                if record.index == 0 and self.on_line is not None:
                    self._echo(line.decode(errors="replace").rstrip("\n"))

    def _echo(self, text: str) -> None:
        """Show a pod-0 line; a failing display must never stop this thread draining the pod's pipe (a
        full pipe blocks the pod), so the echo is switched off instead, with the reason."""
        try:
            self.on_line(text)  # type: ignore[misc]
        except Exception as exc:
            self.on_line = None
            reason = f"{type(exc).__name__}: {exc}"[:200]
            print(f"warning: no longer echoing pod 0's log ({reason})", file=sys.stderr)

    def _stop_all(self) -> None:
        """SIGTERM every pod's process group, then SIGKILL after the pod's grace period; the store last."""
        self._stop(list(self._procs.values()))
        if self._store is not None:
            self._stop([self._store])

    def _stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """SIGTERM, then at the grace period's end SIGKILL every process the pod started, as a container's
        end does. A launcher may start workers in sessions of their own (torchrun does): they are found as
        descendants when the stop begins, since they are orphaned once the launcher is gone."""
        members: list[psutil.Process] = []
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(psutil.Error):
                    members += psutil.Process(proc.pid).children(recursive=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.job.grace_s, 30.0)
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for member in members:  # psutil checks the start time: a reused pid is not killed
            with contextlib.suppress(psutil.Error):
                member.kill()

    def run(self, *, timeout_s: float | None = None, run_dir: Path) -> LocalResult:
        """Run every index to completion under the Job's failure rules (and a JobSet's, whose kinds)."""
        self._failures = dict.fromkeys(range(self.job.completions), 0)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self._start_store()
            self._await_store(deadline)
            records = {i: self._start(i, 0) for i in range(self.job.completions)}
            done: set[int] = set()
            replace_at: dict[int, float] = {}  # lost pods whose replacement is due at a monotonic time
            while len(done) < self.job.completions:
                if deadline is not None and time.monotonic() > deadline:
                    return self._finish(False, f"timed out after {timeout_s:g} s", run_dir)
                progressed = self._restart_store_if_gone()
                for index, due in list(replace_at.items()):
                    if time.monotonic() >= due:
                        del replace_at[index]
                        records[index] = self._start(index, self._failures[index])
                        progressed = True
                for index, proc in list(self._procs.items()):
                    if index in done or index in replace_at or (code := proc.poll()) is None:
                        continue
                    progressed = True
                    records[index].exit_code = code
                    self._free_pod_memory(records[index])
                    if code == 0:
                        done.add(index)
                    elif code == -signal.SIGKILL and self.lost_pod_replace_after_s > 0:
                        self._count_failure(records[index], code)
                        replace_at[index] = time.monotonic() + self.lost_pod_replace_after_s
                    else:
                        self._count_failure(records[index], code)
                        records[index] = self._start(index, self._failures[index])
                if not progressed:
                    self._wait_any(0.2)
        except _Failed as failed:
            return self._finish(False, str(failed), run_dir)
        except KeyboardInterrupt:
            self._finish(False, "interrupted", run_dir)
            raise
        return self._finish(True, "all indexes succeeded", run_dir)

    def _count_failure(self, record: PodRecord, code: int) -> None:
        """A failed pod under the Job's podFailurePolicy: FailJob codes fail the Job at once, others spend
        one of the index's retries; either failure of the Job is the run's (_Failed)."""
        if code in self.job.fail_job_codes:
            said = self._launcher_said(record)
            outcome = self._set_outcome(NODE_JOB, "PodFailurePolicy")
            raise _Failed(f"pod {record.name} exited {code} (FailJob){said}{outcome}")
        self._failures[record.index] += 1
        if (failed := self._failures[record.index]) > self.job.backoff_limit_per_index:
            reason = "FailedIndexes" if self.job.max_failed_indexes is None else "MaxFailedIndexesExceeded"
            raise _Failed(
                f"index {record.index} failed {failed} times (backoffLimitPerIndex "
                f"{self.job.backoff_limit_per_index}); last exit code {code}"
                + self._set_outcome(NODE_JOB, reason)
            )

    def _launcher_said(self, record: PodRecord) -> str:
        """': <the last kit-launch line of the pod's log>' (why its launcher failed the Job), or ''."""
        pump = self._pumps.get(record.name)
        if pump is not None:
            pump.join(timeout=PUMP_DRAIN_S)  # the pod exited: its pipe ends once its last lines are copied
        try:
            lines = record.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        said = [line for line in lines if line.startswith(LAUNCHER_PREFIX)]
        return f": {said[-1]}" if said else ""

    def _wait_any(self, timeout: float) -> None:
        """Block until some pod exits or `timeout` passes (pods exit rarely; this is the poll period)."""
        running = [p for p in self._procs.values() if p.poll() is None]
        if running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running[0].wait(timeout=timeout)

    def _finish(self, ok: bool, reason: str, run_dir: Path) -> LocalResult:
        self._stop_all()
        shutil.rmtree(self.memory_root, ignore_errors=True)
        for index, proc in self._procs.items():
            rec = next(r for r in reversed(self.pods) if r.index == index)
            if rec.exit_code is None:
                rec.exit_code = proc.returncode
        return LocalResult(succeeded=ok, reason=reason, run_dir=run_dir, pods=list(self.pods))


def run_local(
    manifests: list[Manifest],
    *,
    workdir: Path,
    volume_root: Path | None = None,
    timeout_s: float | None = None,
    on_line: Callable[[str], None] | None = None,
    lost_pod_replace_after_s: float = 0.0,
) -> LocalResult:
    """Run the rendered local Job; returns when every index succeeded or the Job failed."""
    job = load_job(manifests)
    runner = LocalRunner(
        job,
        workdir=workdir,
        volume_root=volume_root,
        on_line=on_line,
        lost_pod_replace_after_s=lost_pod_replace_after_s,
    )
    env0 = runner.pod_env(0, f"{job.name}-0-local")
    run_dir = Path(env0.get("RUN_DIR", str(workdir)))
    return runner.run(timeout_s=timeout_s, run_dir=run_dir)
