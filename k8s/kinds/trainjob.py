"""KIND=trainjob: a TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2.3.0) and the run's own
ClusterTrainingRuntime, whose template is the JobSet of KIND=jobset.

Why the kit's launcher still runs: the runtime has no `torch` ML policy, so Trainer's plain-ML plugin sets
only the node count (mlPolicy.numNodes = NODES+SPARES, the trainers' parallelism), adds no PET_* env and no
torchrun command; the TrainJob sets no `trainer` (command, env, nodes), so the runtime's pods run as
rendered. The trainers' replicated job carries Trainer's ancestor label, so Trainer knows which it is.
"""

from __future__ import annotations

import copy
from typing import Any

from fsdpkit.k8s.kinds import NODE_JOB

API_VERSION = "trainer.kubeflow.org/v1alpha1"
API_GROUP = "trainer.kubeflow.org"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"


def runtime_object(*, name: str, labels: dict[str, str], jobset: dict[str, Any]) -> dict[str, Any]:
    """The ClusterTrainingRuntime: the JobSet's spec as its template (suspend is the TrainJob's)."""
    spec = {k: copy.deepcopy(v) for k, v in jobset["spec"].items() if k != "suspend"}
    pods = 0
    for rjob in spec["replicatedJobs"]:
        if rjob["name"] == NODE_JOB:
            rjob["template"].setdefault("metadata", {}).setdefault("labels", {})[ANCESTOR_LABEL] = (
                ANCESTOR_TRAINER
            )
            pods = rjob["template"]["spec"]["parallelism"]
    return {
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"mlPolicy": {"numNodes": pods}, "template": {"spec": spec}},
    }


def trainjob_object(*, jobset: dict[str, Any], runtime: str) -> dict[str, Any]:
    """The TrainJob: the JobSet's metadata, a reference to the runtime, suspended for Kueue as the Job is."""
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": API_GROUP, "kind": "ClusterTrainingRuntime", "name": runtime}
    }
    if jobset["spec"].get("suspend"):
        spec["suspend"] = True
    return {"metadata": copy.deepcopy(jobset["metadata"]), "spec": spec}
