"""KIND=jobset: the rendered Job and rendezvous store as one JobSet (jobset.x-k8s.io/v1alpha2, JobSet v0.12).

Built from the parsed Job and Deployment that KIND=job renders, so the pod templates are the same. What the
JobSet adds, and why (docs/k8s.md, "Three kinds"):
- the store is a replicated job the trainers `dependsOn` (Ready): no launcher starts before its store;
- the trainers' Job keeps its own podFailurePolicy and per-index backoff: a rank fault stays inside the pod
  (the launcher), a lost or drained node's index is replaced alone by the Job controller;
- failurePolicy: maxRestarts 0 and only FailJobSet rules, so JobSet never recreates every pod (the study's
  270 s): a Job that failed (exit 78/69 through FailJob, or an index out of retries) fails the JobSet at once;
- successPolicy: the trainers' Job completing completes the set (the store never exits by itself).
"""

from __future__ import annotations

import copy
from typing import Any

from fsdpkit.k8s.kinds import NODE_JOB, STORE_JOB

API_VERSION = "jobset.x-k8s.io/v1alpha2"
STORE_BACKOFF_LIMIT = 10
"""Store pods the store's Job may replace after crashes (a lost node's is not counted: DisruptionTarget)."""
FATAL_REASONS = ["PodFailurePolicy"]
"""The Job failure reason of the inner podFailurePolicy's FailJob (exit 78 or 69)."""
BUDGET_REASONS = ["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded"]
"""The Job failure reasons of a spent retry budget or deadline: the plain Job fails then too."""

_DISRUPTION_IGNORED = {
    "action": "Ignore",
    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
}


def failure_policy() -> dict[str, Any]:
    """Every child-Job failure fails the set; none restarts it (a restart recreates every pod)."""
    return {
        "maxRestarts": 0,
        "rules": [
            {"name": "FatalExit", "action": "FailJobSet", "onJobFailureReasons": FATAL_REASONS},
            {"name": "RetriesSpent", "action": "FailJobSet", "onJobFailureReasons": BUDGET_REASONS},
        ],
    }


def store_job(store: dict[str, Any]) -> dict[str, Any]:
    """The store's Deployment as a one-pod Job: same pod, restartPolicy Never, node loss not counted."""
    template = copy.deepcopy(store["spec"]["template"])
    template["spec"]["restartPolicy"] = "Never"
    return {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": STORE_BACKOFF_LIMIT,
        "podFailurePolicy": {"rules": [copy.deepcopy(_DISRUPTION_IGNORED)]},
        "template": template,
    }


def trainer_job(job: dict[str, Any]) -> dict[str, Any]:
    """The Indexed Job's spec without what the JobSet owns (suspend, TTL: set on the JobSet itself)."""
    return {
        k: copy.deepcopy(v) for k, v in job["spec"].items() if k not in ("suspend", "ttlSecondsAfterFinished")
    }


def jobset_spec(
    *, job: dict[str, Any], store: dict[str, Any] | None, subdomain: str, suspend: bool
) -> dict[str, Any]:
    """The JobSet's spec around the rendered Job (and the kit's store, None for torchrun/ft_launcher)."""
    node: dict[str, Any] = {"name": NODE_JOB, "replicas": 1, "template": {"spec": trainer_job(job)}}
    replicated: list[dict[str, Any]] = []
    if store is not None:
        replicated.append({"name": STORE_JOB, "replicas": 1, "template": {"spec": store_job(store)}})
        node["dependsOn"] = [{"name": STORE_JOB, "status": "Ready"}]
    replicated.append(node)
    spec: dict[str, Any] = {"suspend": True} if suspend else {}
    spec.update(
        {
            "network": {"enableDNSHostnames": True, "subdomain": subdomain, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "Any", "targetReplicatedJobs": [NODE_JOB]},
            "failurePolicy": failure_policy(),
            "replicatedJobs": replicated,
            "ttlSecondsAfterFinished": job["spec"]["ttlSecondsAfterFinished"],
        }
    )
    return spec


def jobset_object(
    *, job: dict[str, Any], store: dict[str, Any] | None, subdomain: str, suspend: bool
) -> dict[str, Any]:
    """The JobSet: the Job's name, namespace, labels (Kueue's queue label too) and annotations."""
    meta = job["metadata"]
    return {
        "metadata": copy.deepcopy(meta),
        "spec": jobset_spec(job=job, store=store, subdomain=subdomain, suspend=suspend),
    }
