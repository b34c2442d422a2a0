"""The kit's own rules over a JobSet, a ClusterTrainingRuntime and a TrainJob (validate.policy_problems):
what the schemas cannot say. The pods get the same rules as the plain Job's (`pod_rules`, passed in by
fsdpkit.k8s.validate); these add the kind's own: recovery stays the kit's (no JobSet restart), exit 78/69
fail everything at once, the store starts first, rank discovery (index env, pod 0's DNS name) and names that
fit the pods' hostnames, and a TrainJob's runtime in the same rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsdpkit.k8s import names
from fsdpkit.k8s.kinds import NODE_JOB, STORE_JOB, trainer_job_name
from fsdpkit.k8s.kinds.crds import replicated_jobs
from fsdpkit.k8s.spec import FAIL_JOB_EXIT_CODES, INDEX_ANNOTATION, master_addr

PodRules = Callable[[str, str, dict[str, Any]], Iterable[str]]
"""(where, field path of the pod template, the template) -> problems: the plain Job's pod rules."""


def _failure_policy_problems(where: str, base: str, spec: dict[str, Any]) -> Iterator[str]:
    policy = spec.get("failurePolicy") or {}
    if policy.get("maxRestarts", 0) != 0:
        yield f"{where}: {base}.failurePolicy.maxRestarts: must be 0 (a JobSet restart recreates every pod)"
    for i, rule in enumerate(policy.get("rules") or []):
        if rule.get("action") != "FailJobSet":
            yield (
                f"{where}: {base}.failurePolicy.rules[{i}].action: {rule.get('action')!r} must be FailJobSet "
                "(the kit recovers ranks and nodes in place; a JobSet restart recreates every pod)"
            )


def _trainer_job_problems(
    where: str, path: str, job: dict[str, Any], *, set_name: str, namespace: str, subdomain: str
) -> Iterator[str]:
    """The trainers' Job: Indexed, all pods together, FailJob on 78/69, index env, pod 0's name."""
    if job.get("completionMode") != "Indexed":
        yield f"{where}: {path}.completionMode: must be Indexed (the completion index is the node rank)"
    if job.get("completions") != job.get("parallelism"):
        yield f"{where}: {path}.parallelism: must equal completions (all nodes run together)"
    rules = (job.get("podFailurePolicy") or {}).get("rules") or []
    fatal = [r for r in rules if r.get("action") == "FailJob"]
    if not fatal or (fatal[0].get("onExitCodes") or {}).get("values") != FAIL_JOB_EXIT_CODES:
        yield f"{where}: {path}.podFailurePolicy: must fail the Job on exit {FAIL_JOB_EXIT_CODES} first"
    pod = (job.get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") != "Never":
        yield f"{where}: {path}.template.spec.restartPolicy: must be Never (the launcher restarts in the pod)"
    last = f"{trainer_job_name('jobset', set_name)}-{max(int(job.get('completions') or 1) - 1, 0)}"
    if problem := names.dns1123_label(last):
        yield f"{where}: metadata.name: pod hostname {last!r} {problem}; use a shorter RUN_ID"
    want = master_addr(trainer_job_name("jobset", set_name), subdomain, namespace)
    for i, c in enumerate(pod.get("containers") or []):
        env = {e["name"]: e for e in c.get("env") or []}
        addr = (env.get("MASTER_ADDR") or {}).get("value")
        if addr != want:
            yield f"{where}: {path}.template.spec.containers[{i}].env.MASTER_ADDR: {addr!r} must be {want!r}"
        ref = ((env.get("NODE_RANK") or {}).get("valueFrom") or {}).get("fieldRef") or {}
        if ref.get("fieldPath") != f"metadata.annotations['{INDEX_ANNOTATION}']":
            yield f"{where}: {path}.template.spec.containers[{i}].env.NODE_RANK: must be the completion index"


def jobset_problems(
    where: str,
    obj: dict[str, Any],
    services: dict[tuple[str, str], dict[str, Any]],
    pod_rules: PodRules,
    *,
    namespace: str,
    set_name: str,
) -> Iterator[str]:
    """A JobSet or a runtime's JobSet template (`set_name`: the JobSet's name, a runtime's is its TrainJob's):
    failure policy, store order, the trainers' Job, the pods."""
    runtime = obj.get("kind") == "ClusterTrainingRuntime"
    base = "spec.template.spec" if runtime else "spec"
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") if runtime else obj.get("spec")
    spec = spec or {}
    yield from _failure_policy_problems(where, base, spec)
    subdomain = (spec.get("network") or {}).get("subdomain") or set_name
    svc = services.get((namespace, subdomain))
    if svc is None or (svc.get("spec") or {}).get("clusterIP") != "None":
        yield f"{where}: {base}.network.subdomain: {subdomain!r} names no headless Service in {namespace}"
    rjobs = {r.get("name"): (i, r) for i, r in enumerate(replicated_jobs(obj))}
    if NODE_JOB not in rjobs:
        yield f"{where}: {base}.replicatedJobs: no {NODE_JOB!r} replicated job (the trainers)"
    if STORE_JOB in rjobs and NODE_JOB in rjobs:
        deps = rjobs[NODE_JOB][1].get("dependsOn") or []
        if [d.get("name") for d in deps] != [STORE_JOB]:
            yield f"{where}: {base}.replicatedJobs[{NODE_JOB}].dependsOn: must be {STORE_JOB!r} (store first)"
    for name, (i, rjob) in rjobs.items():
        path = f"{base}.replicatedJobs[{i}].template.spec"
        job = (rjob.get("template") or {}).get("spec") or {}
        if rjob.get("replicas") != 1:
            yield f"{where}: {base}.replicatedJobs[{i}].replicas: must be 1 (one Job of {name})"
        yield from pod_rules(where, f"{path}.template", job.get("template") or {})
        if name == NODE_JOB:
            yield from _trainer_job_problems(
                where, path, job, set_name=set_name, namespace=namespace, subdomain=subdomain
            )


def trainjob_problems(where: str, obj: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> Iterator[str]:
    """A TrainJob's runtime must be in the same rendering (the kit applies its own, never a shared one)."""
    ref = (obj.get("spec") or {}).get("runtimeRef") or {}
    if ref.get("kind") != "ClusterTrainingRuntime" or ref.get("name") not in runtimes:
        yield (
            f"{where}: spec.runtimeRef: {ref.get('kind')}/{ref.get('name')} is not rendered with it; "
            "render KIND=trainjob again (the kit renders and applies the run's ClusterTrainingRuntime)"
        )
