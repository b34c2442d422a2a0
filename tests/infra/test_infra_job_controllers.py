"""`kubernetes.job_controllers`: JobSet and Kubeflow Trainer as pinned Helm charts, off by default.

The default synth has neither (its snapshot is unchanged); the `placed` variant turns the option on, so
cfn-lint and cdk-nag (tests/infra/test_infra_lint.py) cover the charts too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsdpkit.infra.config import load_config
from fsdpkit.infra.constructs.job_controllers import JOBSET_REPOSITORY, TRAINER_REPOSITORY
from fsdpkit.infra.errors import ConfigError
from tests.infra.conftest import VARIANTS, Synth, cdk_context, resources

CONTROLLER_CHARTS = {"jobset", "kubeflow-trainer"}


def _charts(synth: Synth, variant: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Chart name -> (logical id, resource) of every Helm chart in the variant's cluster stack."""
    found = resources(synth.template(variant, "cluster"), "Custom::AWSCDK-EKS-HelmChart")
    return {r["Properties"]["Chart"]: (k, r) for k, r in found.items()}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "placed"])
def test_off_by_default_installs_no_controller(synth: Synth, variant: str) -> None:
    assert synth.configs[variant].kubernetes.job_controllers is False
    assert CONTROLLER_CHARTS.isdisjoint(_charts(synth, variant))


def test_on_installs_jobset_then_trainer_pinned_from_their_release_registries(synth: Synth) -> None:
    cfg = synth.configs["placed"].kubernetes
    assert cfg.job_controllers is True
    charts = _charts(synth, "placed")
    jobset_id, jobset = charts["jobset"]
    _, trainer = charts["kubeflow-trainer"]
    assert {k: v for k, v in jobset["Properties"].items() if k in ("Repository", "Version", "Namespace")} == {
        "Repository": "oci://registry.k8s.io/jobset/charts/jobset",
        "Version": "0.12.0",
        "Namespace": "jobset-system",
    }
    assert (cfg.jobset_chart_version, cfg.trainer_chart_version) == ("0.12.0", "2.3.0")
    props = trainer["Properties"]
    assert (props["Repository"], props["Version"], props["Namespace"]) == (
        "oci://ghcr.io/kubeflow/charts/kubeflow-trainer",
        "2.3.0",
        "kubeflow-system",
    )
    assert jobset["Properties"]["Repository"] == JOBSET_REPOSITORY
    assert props["Repository"] == TRAINER_REPOSITORY
    # one JobSet controller: Trainer's bundled copy is off, and Trainer waits for the jobset release
    assert json.loads(props["Values"]) == {"jobset": {"install": False}}
    assert jobset_id in trainer["DependsOn"]
    # the device plugins are still there, unchanged
    assert {"nvidia-device-plugin", "aws-efa-k8s-device-plugin"} <= set(charts)


def test_the_option_needs_the_kubectl_provider() -> None:
    context = {**cdk_context(), "kubernetes.job_controllers": "true", "kubernetes.deploy_objects": "false"}
    with pytest.raises(ConfigError) as caught:
        load_config(context)
    assert str(caught.value) == (
        "kubernetes.job_controllers: the JobSet and Trainer charts are installed through the kubectl "
        "provider; set kubernetes.deploy_objects=true too, or install the controllers yourself (docs/k8s.md)"
    )


@pytest.mark.parametrize("key", ["kubernetes.jobset_chart_version", "kubernetes.trainer_chart_version"])
def test_a_chart_version_is_checked(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({**cdk_context(), key: "latest"})
    assert str(caught.value) == f"{key}: 'latest' is not a chart version like '1.2.3'"
