"""KIND=jobset and KIND=trainjob: the same pods as the Job, in a JobSet (JobSet v0.12) or in a TrainJob on the
run's own ClusterTrainingRuntime (Kubeflow Trainer v2.3.0); asserted by path on parsed YAML, schema-valid
(the CRDs' own vendored schemas, strict, plus the Kubernetes Job schema) and through the kit's policy."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsdpkit.k8s.model import ValuesError
from fsdpkit.k8s.render import Manifest, render
from fsdpkit.k8s.validate import SCHEMA_VERSIONS, ManifestError, policy_problems, schema_problems, validate
from fsdpkit.k8s.values import build_values

REPO = Path(__file__).resolve().parents[2]
NEWEST = SCHEMA_VERSIONS[-1]


def _render(*overrides: str) -> list[Manifest]:
    return render(build_values(outputs=None, overrides=["RUN_ID=t", *overrides], allow_placeholders=True))


def _top(manifests: list[Manifest], kind: str) -> dict[str, Any]:
    (obj,) = [m.obj for m in manifests if m.obj["kind"] == kind]
    return obj


def _rjobs(jobset_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in jobset_spec["replicatedJobs"]}


def _env(pod_template: dict[str, Any]) -> dict[str, Any]:
    c = pod_template["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def _replace(manifests: list[Manifest], obj: dict[str, Any]) -> list[Manifest]:
    """The manifests with the object of obj's kind swapped for obj (a hand-broken rendering)."""
    return [Manifest(m.filename, m.text, obj) if m.obj["kind"] == obj["kind"] else m for m in manifests]


def test_default_kind_is_the_plain_job() -> None:
    default, job = _render(), _render("KIND=job")
    assert [(m.filename, m.text) for m in default] == [(m.filename, m.text) for m in job]
    assert "06-job.yaml" in [m.filename for m in default]
    assert not any(m.obj["kind"] in ("JobSet", "TrainJob") for m in default)


@pytest.mark.parametrize(
    ("kind", "files"),
    [
        ("jobset", ["06-jobset.yaml"]),
        ("trainjob", ["06-clustertrainingruntime.yaml", "07-trainjob.yaml"]),
    ],
)
def test_each_kind_replaces_the_job_and_store_files(kind: str, files: list[str]) -> None:
    job_files = [m.filename for m in _render()]
    names = [m.filename for m in _render(f"KIND={kind}")]
    assert names == [f for f in job_files if f not in ("05-rdzv-store.yaml", "06-job.yaml")] + files
    assert names == sorted(names)  # apply order is file-name order: the runtime before its TrainJob


def test_jobset_node_job_is_the_job_with_pod0_renamed() -> None:
    job = _top(_render("NODES=4", "SPARES=1"), "Job")
    js = _top(_render("NODES=4", "SPARES=1", "KIND=jobset"), "JobSet")
    assert js["metadata"]["name"] == "t" and js["metadata"]["labels"]["kit.io/run-id"] == "t"
    node = _rjobs(js["spec"])["node"]["template"]["spec"]
    want = {k: v for k, v in copy.deepcopy(job["spec"]).items() if k != "ttlSecondsAfterFinished"}
    addr = "t-node-0-0.t.kit-training.svc.cluster.local"
    assert _env(node["template"])["MASTER_ADDR"] == addr
    for e in want["template"]["spec"]["containers"][0]["env"]:
        if e["name"] == "MASTER_ADDR":
            e["value"] = addr
    assert node == want  # same pod template, per-index replacement and podFailurePolicy as the Job's
    assert node["parallelism"] == node["completions"] == 5 and node["podReplacementPolicy"] == "Failed"
    assert js["spec"]["ttlSecondsAfterFinished"] == job["spec"]["ttlSecondsAfterFinished"]
    assert js["spec"]["network"] == {
        "enableDNSHostnames": True,
        "subdomain": "t",
        "publishNotReadyAddresses": True,
    }


def test_jobset_failure_policy_never_restarts_the_set() -> None:
    js = _top(_render("KIND=jobset"), "JobSet")
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 0
    assert [r["action"] for r in policy["rules"]] == ["FailJobSet", "FailJobSet"]
    assert policy["rules"][0]["onJobFailureReasons"] == ["PodFailurePolicy"]  # FailJob on exit 78/69
    node = _rjobs(js["spec"])["node"]["template"]["spec"]
    assert node["podFailurePolicy"]["rules"][0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [69, 78]},
    }
    assert js["spec"]["successPolicy"] == {"operator": "Any", "targetReplicatedJobs": ["node"]}


def test_jobset_store_starts_first_with_the_deployments_pod() -> None:
    manifests = _render()
    deployment = _top(manifests, "Deployment")
    js = _top(_render("KIND=jobset"), "JobSet")
    rjobs = js["spec"]["replicatedJobs"]
    assert [r["name"] for r in rjobs] == ["rdzv", "node"]
    assert rjobs[1]["dependsOn"] == [{"name": "rdzv", "status": "Ready"}]
    store = rjobs[0]["template"]["spec"]
    assert store["template"]["spec"]["containers"] == deployment["spec"]["template"]["spec"]["containers"]
    assert store["template"]["spec"]["restartPolicy"] == "Never" and store["completions"] == 1
    assert store["podFailurePolicy"]["rules"][0]["action"] == "Ignore"  # a lost system node costs no retry


def test_jobset_without_the_kit_launcher_has_no_store_job() -> None:
    js = _top(_render("KIND=jobset", "LAUNCHER=torchrun"), "JobSet")
    (node,) = js["spec"]["replicatedJobs"]
    assert node["name"] == "node" and "dependsOn" not in node
    command = node["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--master-addr=t-node-0-0.t.kit-training.svc.cluster.local" in command


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_kueue_labels_and_suspend_on_each_kind(kind: str) -> None:
    manifests = _render(f"KIND={kind}", "KUEUE_QUEUE=team-a", "PRIORITY_CLASS=high")
    top = _top(manifests, "JobSet" if kind == "jobset" else "TrainJob")
    assert top["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert top["spec"]["suspend"] is True
    spec = (
        top["spec"]
        if kind == "jobset"
        else _top(manifests, "ClusterTrainingRuntime")["spec"]["template"]["spec"]
    )
    assert "suspend" not in (spec if kind == "trainjob" else {})
    pod = _rjobs(spec)["node"]["template"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "high"


def test_no_kueue_no_suspend() -> None:
    js = _top(_render("KIND=jobset"), "JobSet")
    tj = _top(_render("KIND=trainjob"), "TrainJob")
    assert "suspend" not in js["spec"] and "suspend" not in tj["spec"]
    assert "kueue.x-k8s.io/queue-name" not in js["metadata"]["labels"]


def test_trainjob_points_at_the_runs_own_runtime() -> None:
    manifests = _render("KIND=trainjob", "NODES=3", "SPARES=2")
    tj, rt = _top(manifests, "TrainJob"), _top(manifests, "ClusterTrainingRuntime")
    assert tj["metadata"]["name"] == "t" and tj["metadata"]["namespace"] == "kit-training"
    assert tj["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "fsdpkit-t",
    }
    assert "trainer" not in tj["spec"]  # no command, env or node count: the runtime's pods run as rendered
    assert rt["metadata"]["name"] == "fsdpkit-t" and "namespace" not in rt["metadata"]
    assert rt["spec"]["mlPolicy"] == {"numNodes": 5}  # no torch policy: no torchrun, no PET_* env
    node = _rjobs(rt["spec"]["template"]["spec"])["node"]["template"]
    assert node["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert node["spec"]["parallelism"] == 5
    js = _top(_render("KIND=jobset", "NODES=3", "SPARES=2"), "JobSet")
    assert node["spec"] == _rjobs(js["spec"])["node"]["template"]["spec"]  # the JobSet's trainers, unchanged


CASES = [
    ["NODES=1"],
    ["NODES=2"],
    ["NODES=16"],
    ["NODES=4", "SPARES=2"],
    ["NODES=4", "MIN_NODES=2", "TRAIN.training.global_batch=96"],
    ["NODES=2", "KUEUE_QUEUE=team-a", "PRIORITY_CLASS=high"],
    ["NODES=2", "ENTRYPOINT=python -m myproject.train --cfg x", "TRAIN.training.global_batch=16"],
    ["NODES=2", "LAUNCHER=ft_launcher"],
    ["NODES=2", "SPARES=1", "STRAGGLER_POLICY=replace"],
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_every_rendering_is_schema_valid(kind: str, case: list[str]) -> None:
    manifests = _render(f"KIND={kind}", *case)
    validate(manifests, versions=SCHEMA_VERSIONS, allow_placeholders=True)


def test_an_unknown_field_fails_the_crd_schema() -> None:
    manifests = _render("KIND=jobset")
    js = copy.deepcopy(_top(manifests, "JobSet"))
    js["spec"]["restartPolicy"] = "Always"
    (problem,) = schema_problems(_replace(manifests, js), NEWEST)
    assert problem.startswith("06-jobset.yaml: JobSet/t: spec: Additional properties are not allowed")
    assert "'restartPolicy' was unexpected" in problem


def test_an_unknown_field_in_the_embedded_pod_fails() -> None:
    manifests = _render("KIND=trainjob")
    rt = copy.deepcopy(_top(manifests, "ClusterTrainingRuntime"))
    _rjobs(rt["spec"]["template"]["spec"])["node"]["template"]["spec"]["template"]["spec"]["hostname2"] = "x"
    problems = schema_problems(_replace(manifests, rt), NEWEST)
    assert problems and all("hostname2" in p for p in problems)
    assert any("(Kubernetes" in p for p in problems), problems  # the Kubernetes Job schema sees it too


def test_a_restart_rule_is_refused_by_the_policy() -> None:
    manifests = _render("KIND=jobset")
    js = copy.deepcopy(_top(manifests, "JobSet"))
    js["spec"]["failurePolicy"]["rules"][1]["action"] = "RestartJobSet"
    problems = policy_problems(_replace(manifests, js), allow_placeholders=True)
    assert problems == [
        "06-jobset.yaml: JobSet/t: spec.failurePolicy.rules[1].action: 'RestartJobSet' must be FailJobSet "
        "(the kit recovers ranks and nodes in place; a JobSet restart recreates every pod)"
    ]


def test_a_trainjob_without_its_runtime_is_one_line() -> None:
    manifests = [m for m in _render("KIND=trainjob") if m.obj["kind"] != "ClusterTrainingRuntime"]
    with pytest.raises(ManifestError) as err:
        validate(manifests, versions=[NEWEST], allow_placeholders=True)
    assert err.value.problems == [
        "07-trainjob.yaml: TrainJob/t: spec.runtimeRef: ClusterTrainingRuntime/fsdpkit-t is not rendered "
        "with it; render KIND=trainjob again (the kit renders and applies the run's ClusterTrainingRuntime)"
    ]


def test_pod_rules_apply_inside_the_jobset() -> None:
    manifests = _render("KIND=jobset")
    js = copy.deepcopy(_top(manifests, "JobSet"))
    pod = _rjobs(js["spec"])["node"]["template"]["spec"]["template"]
    pod["spec"]["containers"][0]["securityContext"]["privileged"] = True
    pod["metadata"]["labels"]["kit.io/x"] = "y" * 64
    env = pod["spec"]["containers"][0]["env"]
    next(e for e in env if e["name"] == "MASTER_ADDR")["value"] = "t-0.t.kit-training.svc.cluster.local"
    problems = policy_problems(_replace(manifests, js), allow_placeholders=True)
    assert any("securityContext.privileged: must be false" in p for p in problems), problems
    assert any("labels[kit.io/x]" in p for p in problems), problems
    assert any("env.MASTER_ADDR: 't-0.t.kit-training" in p for p in problems), problems


def test_an_unknown_kind_is_one_line() -> None:
    with pytest.raises(ValuesError, match=r"^KIND='deployment' is not one of job, jobset, trainjob$"):
        build_values(outputs=None, overrides=["RUN_ID=t", "KIND=deployment"], allow_placeholders=True)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.k8s", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_renders_and_validates_each_kind(tmp_path: Path) -> None:
    for kind, top in (("jobset", "06-jobset.yaml"), ("trainjob", "07-trainjob.yaml")):
        proc = _cli("render", "RUN_ID=t", f"KIND={kind}", "NODES=2", "SPARES=1", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        obj = yaml.safe_load((tmp_path / "build" / "k8s" / "t" / top).read_text())
        assert obj["metadata"]["name"] == "t"
    proc = _cli("render", "RUN_ID=t", "KIND=deployment", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: KIND='deployment' is not one of job, jobset, trainjob"
    ), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
