"""The three renderings of one training job (KIND): names they share, so spec.py and each kind agree.

KIND=job is the plain Indexed Job plus the store's Deployment (render.OBJECTS); KIND=jobset wraps the same
Job and store in a JobSet (`jobset.py`); KIND=trainjob puts that JobSet into the run's own
ClusterTrainingRuntime and points a TrainJob at it (`trainjob.py`). Pod templates are the Job's, byte for
byte: a kind changes who owns the pods, never what runs in them.
"""

from __future__ import annotations

NODE_JOB = "node"
"""The trainers' replicated job (Kubeflow Trainer's name for it): pod hostnames <run_id>-node-0-<index>."""
STORE_JOB = "rdzv"
"""The rendezvous store's replicated job (kit launcher only), started before the trainers."""
RUNTIME_PREFIX = "fsdpkit-"
"""The run's ClusterTrainingRuntime is fsdpkit-<run_id>: cluster-scoped, so the run id keeps runs apart."""


def runtime_name(run_id: str) -> str:
    """The ClusterTrainingRuntime a TrainJob of this run points at."""
    return f"{RUNTIME_PREFIX}{run_id}"


def trainer_job_name(kind: str, run_id: str) -> str:
    """The name the trainer pods' hostnames start with: the Job's, or JobSet's `<set>-<rjob>-<job index>`."""
    return run_id if kind == "job" else f"{run_id}-{NODE_JOB}-0"
