"""The kubectl boundary: server-side apply, status, delete, and following a run with its rank-0 log.

Every call goes through `Kubectl.run`, so a missing binary or a failing command becomes one KubectlError
line. Following polls the API server (pods and the run's top object: a Job, JobSet or TrainJob) every few
seconds, streams the log of the trainer pod with completion index 0 (a replaced pod 0 is picked up again), and
keeps a one-line progress display. JobSet and TrainJob need their controllers' CRDs, which the cluster may not
serve: `served_crds` asks once, before anything is applied or deleted.
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
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
"""JobSet's label naming a pod's replicated job: the rendezvous store's pods have completion index 0 too."""
TRAINERS_REPLICATED_JOB = "node"
"""The trainer pods' replicated job in the kit's JobSet (and in the JobSet Trainer makes of a TrainJob)."""
CONTROLLERS_OPTION = "kubernetes.job_controllers=true"
"""The stack option that installs JobSet and Kubeflow Trainer (docs/infra.md)."""


@dataclass(frozen=True)
class KindObject:
    """How kubectl reaches one KIND's top object, and what the cluster must serve for it."""

    label: str
    """The object's Kind, for messages."""
    resource: str
    """kubectl's fully qualified resource name (never a short name another CRD could also claim)."""
    done: str
    """The condition type that means success (the failure one is `Failed` for all three)."""
    crds: tuple[str, ...] = ()
    """The CRDs apply needs; none for the built-in Job."""
    install: str = ""
    """What installs the CRDs, for the missing-CRD line."""


JOBSET_CRD = "jobsets.jobset.x-k8s.io"
TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"
RUNTIME_CRD = "clustertrainingruntimes.trainer.kubeflow.org"
KINDS: dict[str, KindObject] = {
    "job": KindObject("Job", "job", "Complete"),
    "jobset": KindObject("JobSet", JOBSET_CRD, "Completed", (JOBSET_CRD,), "JobSet v0.12"),
    "trainjob": KindObject(
        "TrainJob", TRAINJOB_CRD, "Complete", (TRAINJOB_CRD, RUNTIME_CRD), "Kubeflow Trainer v2.3"
    ),
}
"""KIND= (k8s/model.py) -> its top object, named `<run_id>` (the JobSet Trainer makes of a TrainJob too)."""
OPTIONAL_CRDS = (TRAINJOB_CRD, JOBSET_CRD, RUNTIME_CRD)
"""The CRDs status and delete look for (one query); a TrainJob comes before the JobSet it owns."""


def missing_crd_line(kind: str, served: set[str]) -> str | None:
    """One line naming the first CRD KIND needs that the cluster lacks, and how to install it; or None."""
    obj = KINDS[kind]
    missing = [crd for crd in obj.crds if crd not in served]
    if not missing:
        return None
    return (
        f"KIND={kind}: the cluster serves no {missing[0]} CRD, so a {obj.label} cannot be applied; install "
        f"{obj.install} (deploy the stack with -c {CONTROLLERS_OPTION}, docs/infra.md) or render KIND=job"
    )


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

    def served_crds(self, names: tuple[str, ...] = OPTIONAL_CRDS) -> set[str]:
        """Which of `names` the cluster serves, in one call (a missing one is no error)."""
        text = self.run("get", "crd", *names, "--ignore-not-found", "-o", "name")
        found = {line.strip().rpartition("/")[2] for line in text.splitlines()}
        return {name for name in names if name in found}

    def status(self, namespace: str, run_id: str | None) -> str:
        """The run's TrainJob/JobSet conditions and replicated jobs (of the kinds the cluster serves) above
        its Jobs and pods; without a run id every kit job of the namespace."""
        tops = _tops(self.served_crds())
        if not run_id:
            selector = f"app.kubernetes.io/managed-by={MANAGED_BY}"
            return self.run("get", ",".join(["jobs", *tops]), "-n", namespace, "-l", selector, "-o", "wide")
        selector = f"{RUN_ID_LABEL}={run_id}"
        found = self.get_json(",".join(tops), "-n", namespace, "-l", selector) if tops else {}
        lines = [line for obj in found.get("items", []) for line in object_status(obj)]
        table = self.run("get", "job,pods", "-n", namespace, "-l", selector, "-o", "wide")
        return "".join(f"{line}\n" for line in lines) + table

    def delete(self, namespace: str, run_id: str) -> str:
        """Delete the run's TrainJob or JobSet first (their Jobs and pods cascade), then its Job (its pods
        cascade: each drains within its grace period), rendezvous store, Services, ConfigMap, NetworkPolicy
        and token Secret, then its cluster-scoped objects: its own ClusterTrainingRuntime and the node-cordon
        grant (a namespaced object cannot own those); all by the run's label; never the namespace or
        storage. A kind the cluster does not serve is left out: kubectl refuses an unknown resource type."""
        selector = f"{RUN_ID_LABEL}={run_id}"
        served = self.served_crds()
        kinds = ",".join([*_tops(served), NAMESPACED_KINDS])
        namespaced = self.run(
            "delete", kinds, "-n", namespace, "-l", selector, "--ignore-not-found", "--wait=false",
        )  # fmt: skip
        if RUNTIME_CRD in served:  # Trainer's finalizer holds it until the TrainJob is gone: do not wait
            namespaced += self.run(
                "delete", RUNTIME_CRD, "-l", selector, "--ignore-not-found", "--wait=false"
            )
        try:
            return namespaced + self.run("delete", CLUSTER_KINDS, "-l", selector, "--ignore-not-found")
        except KubectlError as exc:
            # Kubernetes < 1.30 may serve no ValidatingAdmissionPolicy: then there is none to delete.
            if "doesn't have a resource type" not in str(exc):
                raise
            return namespaced + self.run("delete", "clusterrolebinding", "-l", selector, "--ignore-not-found")


def _tops(served: set[str]) -> list[str]:
    """The TrainJob and JobSet resources among `served` (TrainJob first: it owns its JobSet)."""
    return [crd for crd in OPTIONAL_CRDS if crd in served and crd != RUNTIME_CRD]


def object_status(obj: dict[str, Any]) -> list[str]:
    """A JobSet's or TrainJob's own state: its true conditions, then one line per replicated/child job."""
    kind = obj.get("kind", "?")
    name = obj.get("metadata", {}).get("name", "?")
    status = obj.get("status", {})
    conditions = [
        f"{c.get('type')}" + (f" ({c.get('reason')}: {c.get('message')})" if c.get("reason") else "")
        for c in status.get("conditions", [])
        if c.get("status") == "True"
    ]
    lines = [f"{kind.lower()}/{name}: {'; '.join(conditions) or 'no condition yet'}"]
    for job in status.get("replicatedJobsStatus", []) or status.get("jobsStatus", []):
        counts = ", ".join(
            f"{job.get(key, 0)} {key}" for key in ("active", "ready", "succeeded", "failed", "suspended")
        )
        lines.append(f"  {job.get('name', '?')}: {counts}")
    return lines


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


def _is_rank0(pod: dict[str, Any]) -> bool:
    """Completion index 0 of the trainers (a JobSet's store pod has index 0 too, in its replicated job)."""
    labels = pod.get("metadata", {}).get("labels", {})
    replicated = labels.get(REPLICATED_JOB_LABEL, TRAINERS_REPLICATED_JOB)
    return _index(pod) == "0" and replicated == TRAINERS_REPLICATED_JOB


def _job_state(job: dict[str, Any], done: str = "Complete") -> tuple[str | None, str]:
    """("Complete", "") once the object's `done` condition is true, ("Failed", why) on failure, else None."""
    for cond in job.get("status", {}).get("conditions", []):
        if cond.get("status") == "True" and cond.get("type") in (done, "Failed"):
            state = "Complete" if cond["type"] == done else "Failed"
            return state, cond.get("message") or cond.get("reason") or ""
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
    kind: str = "job",
) -> int:
    """Follow the run's top object (KIND's) until it completes (0) or fails (1), streaming the rank-0 log
    above a progress line."""
    obj = KINDS[kind]
    label = job_name if kind == "job" else f"{obj.label.lower()} {job_name}"
    progress = Progress()
    stop = threading.Event()
    streamed: set[str] = set()
    seen_pods: set[str] = set()
    streams: list[threading.Thread] = []

    def stream(pod: str) -> None:
        with subprocess.Popen(  # closes its pipe and waits for it, whatever the loop meets
            kubectl.argv("logs", "-f", pod, "-n", namespace, "-c", "trainer"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ) as proc:  # fmt: skip
            for line in proc.stdout or ():
                text = line.rstrip("\n")
                m = _STEP.search(text)
                if m:
                    progress.step, progress.total = int(m[1]), int(m[2])
                console.print(f"[dim]{pod}[/dim] {escape(text)}", markup=True, highlight=False)

    with console.status(progress.line(label)) as status:
        while True:
            job = kubectl.get_json(obj.resource, job_name, "-n", namespace)
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
                if _is_rank0(pod) and phase in ("Running", "Succeeded", "Failed") and name not in streamed:
                    streamed.add(name)
                    streams.append(threading.Thread(target=stream, args=(name,), daemon=True))
                    streams[-1].start()
            state, message = _job_state(job, obj.done)
            status.update(progress.line(label))
            if state is not None:
                stop.set()
                break
            if stop.wait(poll_s):
                break
    # `kubectl logs -f` ends when the container has ended: print the rank-0 log to its last line.
    for thread in streams:
        thread.join(timeout=log_drain_s)
    noun = "job" if kind == "job" else obj.label
    if state == "Complete":
        console.print(f"[green]{noun} {job_name} completed[/green]; run folder /fsx/runs/{run_id}")
        return 0
    console.print(f"[red]{noun} {job_name} failed[/red]: {message}")
    return 1
