"""The kubectl boundary: server-side apply, status, delete, and following a Job with its rank-0 log.

Every call goes through `Kubectl.run`, so a missing binary or a failing command becomes one KubectlError
line. Following polls the API server (pods and the Job) every few seconds, streams the log of the pod with
completion index 0 (a replaced pod 0 is picked up again), and keeps a one-line progress display.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from fsdpkit.k8s.spec import INDEX_ANNOTATION, MANAGED_BY, RUN_ID_LABEL

FIELD_MANAGER = "kit"
NAMESPACED_KINDS = "job,deployment,service,configmap,networkpolicy,secret"
"""What `delete` removes in the run's namespace, by the run's label."""
CLUSTER_KINDS = "clusterrolebinding,validatingadmissionpolicybinding,validatingadmissionpolicy"
"""The run's cluster-scoped objects (the node-cordon grant), by the run's label; the shared ClusterRole
stays (it grants nothing unbound)."""
_STEP = re.compile(r"step (\d+)/(\d+)")


class KubectlError(RuntimeError):
    """kubectl is missing or a kubectl command failed; one line with the fix."""


@dataclass
class Kubectl:
    """Runs kubectl; `binary` is looked up on PATH once."""

    binary: str = ""
    context: str | None = None

    def __post_init__(self) -> None:
        if not self.binary:
            found = shutil.which("kubectl")
            if found is None:
                raise KubectlError(
                    "kubectl not found on PATH; install it (https://kubernetes.io/docs/tasks/tools/) and "
                    "point it at the cluster: aws eks update-kubeconfig --name CLUSTER --region REGION"
                )
            self.binary = found

    def argv(self, *args: str) -> list[str]:
        ctx = ["--context", self.context] if self.context else []
        return [self.binary, *ctx, *args]

    def run(self, *args: str, capture: bool = True) -> str:
        """Run kubectl; KubectlError with kubectl's last stderr line on failure."""
        try:
            proc = subprocess.run(self.argv(*args), capture_output=capture, text=True, check=False)
        except OSError as exc:
            raise KubectlError(f"cannot run {self.binary}: {exc}") from None
        if proc.returncode != 0:
            lines = (proc.stderr or "").strip().splitlines() if capture else []
            detail = lines[-1] if lines else f"exit code {proc.returncode}"
            raise KubectlError(f"kubectl {' '.join(args[:2])} failed: {detail}")
        return proc.stdout or ""

    def get_json(self, *args: str) -> dict[str, Any]:
        text = self.run("get", *args, "-o", "json")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise KubectlError(f"kubectl get {' '.join(args)} returned no JSON") from None

    # -- commands
    def apply(self, folder: Path) -> str:
        """Server-side apply of every manifest in `folder` (a file or a folder, in file-name order)."""
        return self.run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(folder))

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """Create `obj` from stdin (never argv or a file: it may hold a secret); False when it exists already,
        which is kept as it is (a running job's token is never replaced)."""
        try:
            proc = subprocess.run(
                self.argv("create", "-f", "-"), input=json.dumps(obj), capture_output=True, text=True,
                check=False,
            )  # fmt: skip
        except OSError as exc:
            raise KubectlError(f"cannot run {self.binary}: {exc}") from None
        if proc.returncode == 0:
            return True
        lines = (proc.stderr or "").strip().splitlines()
        if any("AlreadyExists" in line or "already exists" in line for line in lines):
            return False
        detail = lines[-1] if lines else f"exit code {proc.returncode}"
        raise KubectlError(f"kubectl create {obj.get('kind', '?')} failed: {detail}")

    def status(self, namespace: str, run_id: str | None) -> str:
        selector = f"{RUN_ID_LABEL}={run_id}" if run_id else f"app.kubernetes.io/managed-by={MANAGED_BY}"
        kinds = "job,pods" if run_id else "jobs"
        return self.run("get", kinds, "-n", namespace, "-l", selector, "-o", "wide")

    def delete(self, namespace: str, run_id: str) -> str:
        """Delete the run's Job (its pods cascade: each drains within its grace period), rendezvous store,
        Services, ConfigMap, NetworkPolicy and token Secret, then its cluster-scoped node-cordon grant (a
        namespaced Job cannot own those); never the namespace or storage."""
        selector = f"{RUN_ID_LABEL}={run_id}"
        namespaced = self.run(
            "delete", NAMESPACED_KINDS, "-n", namespace, "-l", selector, "--ignore-not-found", "--wait=false",
        )  # fmt: skip
        try:
            return namespaced + self.run("delete", CLUSTER_KINDS, "-l", selector, "--ignore-not-found")
        except KubectlError as exc:
            # Kubernetes < 1.30 may serve no ValidatingAdmissionPolicy: then there is none to delete.
            if "doesn't have a resource type" not in str(exc):
                raise
            return namespaced + self.run("delete", "clusterrolebinding", "-l", selector, "--ignore-not-found")


@dataclass
class Progress:
    """What the progress line shows; updated from the poll loop and the log thread."""

    phases: Counter[str] = field(default_factory=Counter)
    step: int | None = None
    total: int | None = None
    replaced: int = 0
    last_line: str = ""

    def line(self, job: str) -> str:
        pods = ", ".join(f"{n} {p.lower()}" for p, n in sorted(self.phases.items())) or "no pods yet"
        step = f" | step {self.step}/{self.total}" if self.step is not None else ""
        repl = f" | {self.replaced} pod(s) replaced" if self.replaced else ""
        return f"{job}: {pods}{step}{repl}"


def _index(pod: dict[str, Any]) -> str | None:
    return pod.get("metadata", {}).get("annotations", {}).get(INDEX_ANNOTATION)


def _job_state(job: dict[str, Any]) -> tuple[str | None, str]:
    for cond in job.get("status", {}).get("conditions", []):
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return cond["type"], cond.get("message") or cond.get("reason") or ""
    return None, ""


def follow(
    kubectl: Kubectl,
    *,
    namespace: str,
    job_name: str,
    run_id: str,
    console: Console,
    poll_s: float = 3.0,
    log_drain_s: float = 30.0,
) -> int:
    """Follow the Job until it completes (0) or fails (1), streaming the rank-0 log above a progress line."""
    progress = Progress()
    stop = threading.Event()
    streamed: set[str] = set()
    seen_pods: set[str] = set()
    streams: list[threading.Thread] = []

    def stream(pod: str) -> None:
        proc = subprocess.Popen(
            kubectl.argv("logs", "-f", pod, "-n", namespace, "-c", "trainer"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for line in proc.stdout or ():
            text = line.rstrip("\n")
            m = _STEP.search(text)
            if m:
                progress.step, progress.total = int(m[1]), int(m[2])
            console.print(f"[dim]{pod}[/dim] {escape(text)}", markup=True, highlight=False)
        proc.wait()

    with console.status(progress.line(job_name)) as status:
        while True:
            job = kubectl.get_json("job", job_name, "-n", namespace)
            pods = kubectl.get_json("pods", "-n", namespace, "-l", f"{RUN_ID_LABEL}={run_id}").get(
                "items", []
            )
            progress.phases = Counter(p.get("status", {}).get("phase", "Unknown") for p in pods)
            names = {p["metadata"]["name"] for p in pods}
            progress.replaced = len(seen_pods | names) - len(names) if seen_pods else 0
            seen_pods |= names
            for pod in pods:
                name = pod["metadata"]["name"]
                phase = pod.get("status", {}).get("phase")
                if (
                    _index(pod) == "0"
                    and phase in ("Running", "Succeeded", "Failed")
                    and name not in streamed
                ):
                    streamed.add(name)
                    streams.append(threading.Thread(target=stream, args=(name,), daemon=True))
                    streams[-1].start()
            state, message = _job_state(job)
            status.update(progress.line(job_name))
            if state is not None:
                stop.set()
                break
            if stop.wait(poll_s):
                break
    # `kubectl logs -f` ends when the container has ended: print the rank-0 log to its last line.
    for thread in streams:
        thread.join(timeout=log_drain_s)
    if state == "Complete":
        console.print(f"[green]job {job_name} completed[/green]; run folder /fsx/runs/{run_id}")
        return 0
    console.print(f"[red]job {job_name} failed[/red]: {message}")
    return 1
