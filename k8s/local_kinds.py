"""What the local runner takes from each KIND's rendering: the trainers' Indexed Job, the store's pod, and
(JobSet, TrainJob) the JobSet's own failure rules, read from the rendered objects as the controllers would.

KIND=job: the Job and the store's Deployment (recreated whenever it ends). KIND=jobset: the JobSet's
replicated job `node` is the trainers' Job (named `<set>-node-0`, as the JobSet controller names it, so the
pods' hostnames match MASTER_ADDR), `rdzv` is the store's one-pod Job (its `backoffLimit` counted), created
first when `node` says `dependsOn: rdzv Ready`. KIND=trainjob: Kubeflow Trainer makes a JobSet named after
the TrainJob from its ClusterTrainingRuntime's template, with the trainers' parallelism and completions set
to the TrainJob's numNodes (its `trainer.numNodes`, else the runtime's `mlPolicy.numNodes`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from fsdpkit.k8s.kinds import NODE_JOB, STORE_JOB

RESTARTING_ACTIONS = ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
TRAINJOB_SPEC_RUN = frozenset({"runtimeRef", "suspend", "trainer"})
"""The TrainJob fields the local runner applies (suspend is Kueue's: a local run is admitted at once)."""


class LocalRunError(ValueError):
    """Manifests the local runner cannot run (wrong profile, missing objects); one line."""


@dataclass(frozen=True)
class SetPolicy:
    """The JobSet's failurePolicy as its controller applies it to a failed child Job, with no restart left
    (maxRestarts 0): the first rule that matches names why the set failed; with none, the set fails too."""

    owner: str
    """Who failed, as the user applied it: `JobSet <name>` or `TrainJob <name>`."""
    rules: tuple[tuple[str, frozenset[str], frozenset[str]], ...]
    """(rule name, onJobFailureReasons, targetReplicatedJobs); an empty set matches any."""

    def outcome(self, rjob: str, reason: str) -> str:
        """'; <owner> failed: ...' for the child Job of replicated job `rjob` that failed with `reason`."""
        why = f"; {self.owner} failed: its Job {rjob!r} failed ({reason}), "
        for name, reasons, targets in self.rules:
            if (not reasons or reason in reasons) and (not targets or rjob in targets):
                return f"{why}failurePolicy rule {name} (FailJobSet)"
        return f"{why}no failurePolicy rule matched and maxRestarts is 0"


@dataclass(frozen=True)
class Workload:
    """The trainers' Job (a Job object) and the store's pod, from whichever kind owns them."""

    job: dict[str, Any]
    store: dict[str, Any] | None = None
    """The store's container, or None (torchrun, ft_launcher: pod 0 hosts the rendezvous)."""
    store_host: str = ""
    """The store Service's DNS name, as the pods' command line names it."""
    store_pod: str = ""
    """The store pod's name without its attempt suffix."""
    store_backoff_limit: int | None = None
    """Store pods its Job may replace (None: a Deployment, which recreates it every time)."""
    store_first: bool = False
    """`dependsOn: rdzv Ready`: the trainers start once the store's pod is Ready."""
    policy: SetPolicy | None = None
    """The JobSet's rules (None: a plain Job, whose own failure is the run's)."""


def workload(manifests: list[dict[str, Any]]) -> Workload:
    """The one Job, JobSet or TrainJob in the manifests, as the runner runs it; LocalRunError otherwise."""
    tops = [m for m in manifests if m.get("kind") in ("Job", "JobSet", "TrainJob")]
    if len(tops) != 1:
        kinds = sorted(m["kind"] for m in tops)
        raise LocalRunError(
            f"expected one Job, JobSet or TrainJob in the manifests, found {len(tops)} {kinds}"
        )
    top = tops[0]
    if top["kind"] == "Job":
        return _plain_job(top, manifests)
    if top["kind"] == "JobSet":
        return _jobset(top["metadata"], top["spec"], manifests, owner=f"JobSet {top['metadata']['name']}")
    return _trainjob(top, manifests)


def _plain_job(job: dict[str, Any], manifests: list[dict[str, Any]]) -> Workload:
    """KIND=job: the store is a Deployment behind the Service of the same name."""
    deployments = [m for m in manifests if m.get("kind") == "Deployment"]
    if not deployments:
        return Workload(job=job)
    meta = deployments[0]["metadata"]
    return Workload(
        job=job,
        store=deployments[0]["spec"]["template"]["spec"]["containers"][0],
        store_host=f"{meta['name']}.{meta.get('namespace', 'default')}.svc.cluster.local",
        store_pod=f"{job['metadata']['name']}-rdzv",
    )


def _jobset(
    meta: dict[str, Any], spec: dict[str, Any], manifests: list[dict[str, Any]], *, owner: str
) -> Workload:
    """A JobSet's replicated jobs as the controller creates them: Job `<set>-<rjob>-0` each."""
    name = meta["name"]
    rjobs = {r["name"]: r for r in spec.get("replicatedJobs", [])}
    if NODE_JOB not in rjobs:
        raise LocalRunError(
            f"{owner}: no replicated job {NODE_JOB!r} (the trainers) in {sorted(rjobs)}; render it again"
        )
    for rjob in rjobs.values():
        if rjob.get("replicas", 1) != 1:
            raise LocalRunError(
                f"{owner}: replicated job {rjob['name']!r} has replicas {rjob['replicas']}; the kit renders 1"
            )
    policy = _set_policy(spec.get("failurePolicy", {}), owner)
    _check_success_policy(spec.get("successPolicy"), owner)
    node = rjobs[NODE_JOB]
    job = {
        "metadata": {
            "name": f"{name}-{NODE_JOB}-0",
            "namespace": meta.get("namespace", "default"),
            "labels": dict(meta.get("labels", {})),
        },
        "spec": node["template"]["spec"],
    }
    depends = {(d["name"], d["status"]) for d in node.get("dependsOn", [])}
    if depends - {(STORE_JOB, "Ready")}:
        raise LocalRunError(f"{owner}: {NODE_JOB!r} dependsOn {sorted(depends)}; the runner knows rdzv Ready")
    if STORE_JOB not in rjobs:
        return Workload(job=job, policy=policy)
    store_job = rjobs[STORE_JOB]["template"]["spec"]
    pod = store_job["template"]
    return Workload(
        job=job,
        store=pod["spec"]["containers"][0],
        store_host=_service_host(pod.get("metadata", {}).get("labels", {}), manifests, owner),
        store_pod=f"{name}-{STORE_JOB}-0",
        store_backoff_limit=int(store_job.get("backoffLimit", 6)),  # the Job API's default
        store_first=bool(depends),
        policy=policy,
    )


def _set_policy(failure_policy: dict[str, Any], owner: str) -> SetPolicy:
    """The rules, refused when one could restart the set: the runner never recreates every pod."""
    restarts = int(failure_policy.get("maxRestarts", 0))
    rules = failure_policy.get("rules", [])
    restarting = [r["name"] for r in rules if r.get("action") in RESTARTING_ACTIONS]
    if restarts or restarting:
        raise LocalRunError(
            f"{owner}: failurePolicy could restart the whole set (maxRestarts {restarts}, rules "
            f"{restarting}); the local runner runs FailJobSet rules only, as the kit renders them"
        )
    return SetPolicy(
        owner=owner,
        rules=tuple(
            (
                r["name"],
                frozenset(r.get("onJobFailureReasons", [])),
                frozenset(r.get("targetReplicatedJobs", [])),
            )
            for r in rules
        ),
    )


def _check_success_policy(policy: dict[str, Any] | None, owner: str) -> None:
    """The runner ends the set when the trainers' Job completes: the kit's `Any` of `node` (the store never
    completes, so a policy that waits for it would never end)."""
    targets = (policy or {}).get("targetReplicatedJobs", [])
    if policy is None or policy.get("operator") != "Any" or targets != [NODE_JOB]:
        raise LocalRunError(
            f"{owner}: successPolicy {policy} never completes locally; the kit renders Any of [{NODE_JOB!r}]"
        )


def _service_host(labels: dict[str, str], manifests: list[dict[str, Any]], owner: str) -> str:
    """The DNS name of the Service whose selector picks the store's pod (its address in the pods' argv)."""
    for svc in manifests:
        selector = svc.get("spec", {}).get("selector") if svc.get("kind") == "Service" else None
        if selector and selector.items() <= labels.items():
            meta = svc["metadata"]
            return f"{meta['name']}.{meta.get('namespace', 'default')}.svc.cluster.local"
    raise LocalRunError(f"{owner}: no Service selects the {STORE_JOB!r} pod; render it again")


def _trainjob(tj: dict[str, Any], manifests: list[dict[str, Any]]) -> Workload:
    """The JobSet that Trainer makes of the named ClusterTrainingRuntime, named after the TrainJob."""
    meta, spec = tj["metadata"], tj["spec"]
    owner = f"TrainJob {meta['name']}"
    if unknown := sorted(set(spec) - TRAINJOB_SPEC_RUN) + sorted(
        f"trainer.{k}" for k in set(spec.get("trainer", {})) - {"numNodes"}
    ):
        raise LocalRunError(f"{owner}: spec field(s) {unknown} are not run locally; render it again")
    ref = spec.get("runtimeRef", {})
    runtimes = {
        m["metadata"]["name"]: m
        for m in manifests
        if m.get("kind") == ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime"
    }
    runtime = runtimes.get(ref.get("name", ""))
    if runtime is None:
        raise LocalRunError(
            f"{owner}: its ClusterTrainingRuntime {ref.get('name')!r} is not among the manifests; render "
            "KIND=trainjob again (the kit renders the run's runtime with it)"
        )
    jobset_spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    nodes = spec.get("trainer", {}).get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes"))
    for rjob in jobset_spec.get("replicatedJobs", []):
        if rjob["name"] == NODE_JOB and nodes is not None:
            rjob["template"]["spec"].update(parallelism=int(nodes), completions=int(nodes))
    return _jobset(meta, jobset_spec, manifests, owner=owner)
