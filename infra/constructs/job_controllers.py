"""JobSet and Kubeflow Trainer (Helm charts from their releases' OCI registries, pinned): the controllers of
the training job's other kinds, `KIND=jobset` and `KIND=trainjob` (docs/k8s.md). Off by default
(`kubernetes.job_controllers`): the kit's own `KIND=job` needs no controller beyond Kubernetes'.

Sources: JobSet v0.12.0 (kubernetes-sigs/jobset, tag commit f22e565ac3cc3265c7c45ef67ecffdc689af5d77,
charts/jobset) and Kubeflow Trainer v2.3.0 (kubeflow/trainer, tag commit
658725bdae5c7e3a0854d93ac6ff492e109a22ab, charts/kubeflow-trainer, which depends on the jobset chart 0.12.0).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IConstruct

from fsdpkit.infra.config import KubernetesConfig

JOBSET_REPOSITORY = "oci://registry.k8s.io/jobset/charts/jobset"
"""The chart's OCI reference (its release README: `helm install jobset oci://registry.k8s.io/jobset/charts/
jobset`); CDK's Helm handler pulls an OCI chart by this full reference."""
TRAINER_REPOSITORY = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
"""The chart's OCI reference (Trainer's chart README and release notes)."""
JOBSET_NAMESPACE = "jobset-system"
"""The namespace JobSet's install guide uses."""
TRAINER_NAMESPACE = "kubeflow-system"
"""The namespace Trainer's install guide uses."""


def trainer_values() -> dict[str, object]:
    """Trainer without its bundled JobSet: the jobset chart here installs it once (two JobSet controllers
    would race on every JobSet), and without the chart's built-in runtimes (the kit applies its own
    ClusterTrainingRuntime per run; the runtimes' installer Job would pull an image from Docker Hub)."""
    return {"jobset": {"install": False}}


class JobControllers(Construct):
    """Install JobSet, then Kubeflow Trainer (its webhook checks the JobSet API), on the system nodes: the GPU
    nodes' taint keeps the controllers off them without any setting."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: KubernetesConfig,
        cluster: eks.Cluster,
        after: Sequence[IConstruct] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.jobset = eks.HelmChart(
            self,
            "JobSet",
            cluster=cluster,
            chart="jobset",
            repository=JOBSET_REPOSITORY,
            version=cfg.jobset_chart_version,
            release="jobset",
            namespace=JOBSET_NAMESPACE,
            create_namespace=True,
        )
        self.trainer = eks.HelmChart(
            self,
            "Trainer",
            cluster=cluster,
            chart="kubeflow-trainer",
            repository=TRAINER_REPOSITORY,
            version=cfg.trainer_chart_version,
            release="kubeflow-trainer",
            namespace=TRAINER_NAMESPACE,
            create_namespace=True,
            values=trainer_values(),
        )
        self.trainer.node.add_dependency(self.jobset)
        for dependency in after:
            self.jobset.node.add_dependency(dependency)
