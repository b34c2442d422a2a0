# ruff: noqa: E501  (exact commands and messages, one per line)
"""`python -m fsdpkit.k8s`: bad input exits non-zero with one line and no traceback; dry runs; apply/status/delete
against a stand-in kubectl on PATH (the boundary), which records its argv and answers like a cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, cwd: Path, path: str | None = None, extra_env: dict | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(extra_env or {})}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.k8s", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


BAD_INPUT = [
    (["render", "NODES=0"], 2, "error: NODES=0: must be at least 1"),
    (["render", "RUN_ID=t", "OUT=/dev/null/m"], 2, "error: OUT='/dev/null/m': '/dev/null' is a file, so"),
    (["render", "RUN_ID=t", "--out", "/dev/null"], 2, "error: --out='/dev/null': '/dev/null' is a file, not"),
    (["local", "RUN_ID=t", "WORKDIR=/dev/null"], 2, "error: WORKDIR='/dev/null': '/dev/null' is a file, not"),
    (["render", "NODEZ=2"], 2, "error: unknown value NODEZ; did you mean NODES?"),
    (["render", "--nodes", "x"], 2, "error: NODES='x': not a whole number"),
    (
        ["render", "RUN_ID=t", "--outputs", "absent.json"],
        2,
        "error: stack outputs file absent.json not found",
    ),
    (
        ["apply", "RUN_ID=t"],
        2,
        "error: stack outputs file cdk-outputs.json not found; run 'make deploy' first",
    ),
    (
        ["render", "--bogus"],
        2,
        "error: unrecognized arguments: --bogus (see python -m fsdpkit.k8s render --help)",
    ),
    (["frobnicate"], 2, "error: argument command: invalid choice: 'frobnicate'"),
    (["status", "NODES=2"], 2, "error: status takes RUN_ID=<id> and NAMESPACE=<ns> only, not NODES"),
    (["delete"], 2, "error: delete needs RUN_ID=<id> (make train-job-status lists the runs)"),
    (["local", "PROFILE=p5"], 2, "error: PROFILE=p5: the local runner runs PROFILE=local only; drop PROFILE"),
    (
        ["render", "RUN_ID=t", "--kube-version", "1.99"],
        2,
        "error: --kube-version 1.99: is not supported; the kit's Job needs 1.29 or newer",
    ),
    (
        ["render", "RUN_ID=t", "KUBERNETES_VERSION=1.28"],
        2,
        "error: KUBERNETES_VERSION=1.28: is not supported; the kit's Job needs 1.29 or newer and its schemas are "
        "bundled up to 1.37: use one of 1.29 to 1.37",
    ),
    (
        ["render", "NODES=4", "NODES=5"],
        2,
        "error: NODES is given twice (NODES=4, then NODES=5); give each key once",
    ),
    (["render", "--nodes", "4", "--nodes", "5"], 2, "error: --nodes is given twice; give it once"),
    (
        ["render", "--nodes", "4", "NODES=5"],
        2,
        "error: NODES is given twice (NODES=5, then NODES=4); give each key once",
    ),
    (
        ["render", "OUTPUTS=a.json", "OUTPUTS=b.json"],
        2,
        "error: OUTPUTS is given twice (OUTPUTS=a.json, then OUTPUTS=b.json)",
    ),
    (
        ["render", "--outputs", "a.json", "OUTPUTS=b.json"],
        2,
        "error: OUTPUTS is given twice (--outputs and OUTPUTS=b.json)",
    ),
    (
        ["apply", "DRY_RUN=y"],
        2,
        "error: DRY_RUN='y': not a boolean; use one of 1/true/yes/on or 0/false/no/off",
    ),
    (["apply", "DRY_RUN=1", "DRY_RUN=0"], 2, "error: DRY_RUN is given twice (DRY_RUN=1, then DRY_RUN=0)"),
    (["apply", "--dry-run", "DRY_RUN=0"], 2, "error: DRY_RUN is given twice (--dry-run and DRY_RUN=0)"),
    (["render", "INPROCESS=y"], 2, "error: INPROCESS='y': not a boolean"),
    (["render", "DRY_RUN=maybe"], 2, "error: DRY_RUN='maybe': not a boolean"),
    (["apply", "DRY_RUN="], 2, "error: DRY_RUN='': not a boolean"),
    (["render", "NODES=\u0664"], 2, "error: NODES='\u0664': not a whole number"),
    (["render", "SEQ_LEN=1_024"], 2, "error: SEQ_LEN='1_024': not a whole number"),
    (
        ["render", "TRAIN.training.efa_devices=abc"],
        2,
        "error: TRAIN.training.efa_devices='abc': not a whole number (0 skips the EFA check)",
    ),
    (["render", "ENV.X=\udcff"], 2, "error: override ENV.X=\\udcff holds bytes that are not UTF-8"),
    (["local", "--timeout", "nan"], 2, "error: argument --timeout: 'nan': must be a finite number"),
    (["local", "--timeout", "inf"], 2, "error: argument --timeout: 'inf': must be a finite number"),
    (["local", "--timeout", "0"], 2, "error: argument --timeout: '0': must be greater than 0"),
    (["local", "--timeout", "1e12"], 2, "error: argument --timeout: '1e12': must be at most 2592000.0"),
    (["local", "TIMEOUT=nan"], 2, "error: TIMEOUT='nan': must be a finite number"),
    (["local", "TIMEOUT=-5"], 2, "error: TIMEOUT='-5': must be greater than 0"),
    (["local", "TIMEOUT=9e99"], 2, "error: TIMEOUT='9e99': must be at most 2592000.0"),
    (["local", "TIMEOUT=5", "--timeout", "5"], 2, "error: TIMEOUT is given twice (--timeout and TIMEOUT=5)"),
    (
        ["local", "--lost-pod-replace-after", "nan"],
        2,
        "error: argument --lost-pod-replace-after: 'nan': must be a finite number",
    ),
    (
        ["local", "--lost-pod-replace-after", "-1"],
        2,
        "error: argument --lost-pod-replace-after: '-1': must be at least 0",
    ),
    (
        ["local", "--lost-pod-replace-after", "1", "--lost-pod-replace-after", "2"],
        2,
        "error: --lost-pod-replace-after is given twice; give it once",
    ),
    (["render", "--rdzv-port", "nan"], 2, "error: RDZV_PORT='nan': not a whole number"),
    (
        ["render", "--monitor-interval-s", "inf"],
        2,
        "error: MONITOR_INTERVAL_S='inf': must be a finite number",
    ),
    (
        ["render", f"NODE_SELECTOR.{'k' * 70}=x"],
        2,
        f"error: NODE_SELECTOR.{'k' * 70}=x: the label key has a name part of 70 characters (at most 63)",
    ),
    (["render", "KUEUE_QUEUE=Team_Q"], 2, "error: KUEUE_QUEUE=Team_Q: the Kueue queue name"),
    (
        ["render", "PRIORITY_CLASS=High"],
        2,
        "error: PRIORITY_CLASS=High: a PriorityClass name must be a DNS-1123 subdomain",
    ),
    (["render", "RUN_ID=t", "ENV.RANK=3"], 2, "error: ENV.RANK=3: is set by the kit or the launcher"),
    (
        ["render", "ENTRYPOINT=python t.py", "ENTRYPOINT=python u.py"],
        2,
        "error: ENTRYPOINT is given twice (ENTRYPOINT=python t.py, then ENTRYPOINT=python u.py); give each key once",
    ),
    (
        ["render", "ENTRYPOINT=python t.py", "--entrypoint", "python u.py"],
        2,
        "error: ENTRYPOINT is given twice (ENTRYPOINT=python t.py, then ENTRYPOINT=python u.py)",
    ),
    (
        ["local", "ENTRYPOINT=python -m", "DRY_RUN=1"],
        2,
        "error: ENTRYPOINT=python -m: python -m needs a module name",
    ),
    (
        ["local", "--entrypoint", "--foo", "DRY_RUN=1"],
        2,
        "error: argument --entrypoint: expected one argument",
    ),
    (
        ["local", "--entrypoint=--foo", "DRY_RUN=1"],
        2,
        "error: ENTRYPOINT=--foo: starts with an option (--foo)",
    ),
    (["local", "IMAGE=Kit Trainer", "DRY_RUN=1"], 2, "error: IMAGE=Kit Trainer: is not an image reference"),
]


@pytest.mark.parametrize(("args", "code", "message"), BAD_INPUT, ids=[" ".join(a) for a, _, _ in BAD_INPUT])
def test_k8s_cli_bad_input(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == code
    assert proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr + proc.stdout


def test_k8s_cli_missing_kubectl(tmp_path: Path, outputs_file: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for cmd in ("status", "delete"):
        proc = run_cli(cmd, "RUN_ID=t", cwd=tmp_path, path=str(bare))
        assert proc.returncode == 1
        assert proc.stderr.startswith("error: kubectl not found on PATH; install it")
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = run_cli("apply", "RUN_ID=t", f"OUTPUTS={outputs_file}", cwd=tmp_path, path=str(bare))
    assert proc.returncode == 1 and proc.stderr.startswith("error: kubectl not found on PATH")


def test_k8s_cli_dry_run_before_deploy(tmp_path: Path) -> None:
    proc = run_cli("apply", "NODES=4", "MODEL=llama3.1-8b", "DRY_RUN=1", "RUN_ID=first-look", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "build" / "k8s" / "first-look"
    assert sorted(p.name for p in out.glob("*.yaml"))[-1] == "06-job.yaml"
    assert f"into {Path('build/k8s/first-look')}/" in proc.stdout
    assert "PLACEHOLDER" in proc.stdout and "DRY_RUN: nothing applied" in proc.stdout
    assert '"PLACEHOLDER.invalid/kit-trainer:latest"' in (out / "06-job.yaml").read_text()
    # make plan's line for the job as rendered (4 p5 nodes of the 8B: few faults, nothing to warn about)
    plan = [line for line in proc.stdout.splitlines() if line.startswith("plan: expected strict goodput ")]
    assert len(plan) == 1 and "(4 nodes, 0 spare(s), memory tiers on)" in plan[0], proc.stdout
    assert "warning" not in proc.stderr


def test_k8s_cli_dry_run_with_outputs_and_make_variables(tmp_path: Path, outputs_file: Path) -> None:
    # What `make train-job NODES=2 DRY_RUN=1 OUTPUTS=...` passes through $(MAKEOVERRIDES).
    proc = run_cli("apply", "NODES=2", "DRY_RUN=1", f"OUTPUTS={outputs_file}", "PYTHON=python3", "RUN_ID=r2",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = (tmp_path / "build" / "k8s" / "r2" / "06-job.yaml").read_text()
    assert "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer:latest" in job
    assert "PLACEHOLDER" not in proc.stdout + job


FAKE_KUBECTL = '''\
#!{python}
"""Stand-in for kubectl: records argv, answers `get` with the JSON in $FAKE_STATE."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
state = os.environ.get("FAKE_STATE", "Complete")
if args[0] == "create":  # create-if-absent of the run's token Secret: the first one is kept
    obj = json.loads(sys.stdin.read())
    store = os.environ["FAKE_LOG"] + ".secret"
    if os.path.exists(store):
        print('Error from server (AlreadyExists): secrets "%s" already exists' % obj["metadata"]["name"], file=sys.stderr)
        sys.exit(1)
    with open(store, "w") as fh:
        json.dump(obj, fh)
    print("secret/%s created" % obj["metadata"]["name"])
elif args[:2] == ["get", "crd"]:  # the cluster serves neither JobSet nor Trainer
    pass
elif args[0] == "apply":
    print("job.batch/r3 serverside-applied")
elif args[:2] == ["get", "job"]:
    print(json.dumps({{"status": {{"conditions": [{{"type": state, "status": "True", "message": "BackoffLimitExceeded"}}]}}}}))
elif args[:2] == ["get", "pods"]:
    pod = {{"metadata": {{"name": "r3-0-abcde", "annotations": {{"batch.kubernetes.io/job-completion-index": "0"}}}},
            "status": {{"phase": "Succeeded"}}}}
    print(json.dumps({{"items": [pod]}}))
elif args[0] == "logs":
    print("[trainer] step 10/10 loss 1.0")
    print("[trainer] done at step 10")
elif args[0] == "get":
    print("NAME   COMPLETIONS   AGE\\nr3     2/2           1m")
elif args[0] == "delete" and "validatingadmissionpolicy" in args[1] and os.environ.get("FAKE_NO_VAP"):
    print("error: the server doesn't have a resource type validatingadmissionpolicybinding", file=sys.stderr)
    sys.exit(1)
elif args[0] == "delete":
    print('job.batch "r3" deleted')
'''


@pytest.fixture
def fake_kubectl(tmp_path: Path) -> tuple[str, Path]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(FAKE_KUBECTL.format(python=sys.executable))
    script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", tmp_path / "kubectl.log"


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize(("state", "code"), [("Complete", 0), ("Failed", 1)])
def test_k8s_cli_apply_follows_the_job(
    state: str, code: int, tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    path, log = fake_kubectl
    proc = run_cli("apply", "RUN_ID=r3", f"OUTPUTS={outputs_file}", cwd=tmp_path, path=path,
                   extra_env={"FAKE_LOG": str(log), "FAKE_STATE": state})  # fmt: skip
    assert proc.returncode == code, proc.stderr
    calls = _calls(log)
    folder = Path("build/k8s/r3")
    assert calls[:3] == [
        ["apply", "--server-side", "--field-manager=kit", "-f", str(folder / "00-namespace.yaml")],
        ["create", "-f", "-"],  # the run's token, from stdin: never argv, never a file
        ["apply", "--server-side", "--field-manager=kit", "-f", str(folder)],
    ]
    secret = json.loads(Path(f"{log}.secret").read_text())
    assert secret["metadata"]["name"] == "r3-run-token" and secret["immutable"] is True
    assert re.fullmatch(r"[0-9a-f]{64}", secret["stringData"]["token"])
    assert "secret/r3-run-token created" in proc.stdout
    assert ["get", "pods", "-n", "kit-training", "-l", "kit.io/run-id=r3", "-o", "json"] in calls
    assert (
        "4 pods x 8 processes = world size 32" in proc.stdout
        and "rank 0 at r3-0.r3.kit-training.svc.cluster.local:29500" in proc.stdout
    )
    if state == "Complete":
        assert ["logs", "-f", "r3-0-abcde", "-n", "kit-training", "-c", "trainer"] in calls
        assert "job r3 completed" in proc.stdout
    else:
        assert "job r3 failed: BackoffLimitExceeded" in proc.stdout


def test_k8s_cli_status_and_delete(tmp_path: Path, fake_kubectl) -> None:
    path, log = fake_kubectl
    env = {"FAKE_LOG": str(log)}
    assert run_cli("status", "RUN_ID=r3", cwd=tmp_path, path=path, extra_env=env).returncode == 0
    assert run_cli("status", cwd=tmp_path, path=path, extra_env=env).returncode == 0
    proc = run_cli("delete", "RUN_ID=r3", "NAMESPACE=ml", cwd=tmp_path, path=path, extra_env=env)
    assert proc.returncode == 0 and "stay on FSx" in proc.stdout
    crds = ["get", "crd", "trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io",
            "clustertrainingruntimes.trainer.kubeflow.org", "--ignore-not-found", "-o", "name"]  # fmt: skip
    assert _calls(log) == [
        crds,
        ["get", "job,pods", "-n", "kit-training", "-l", "kit.io/run-id=r3", "-o", "wide"],
        crds,
        ["get", "jobs", "-n", "kit-training", "-l", "app.kubernetes.io/managed-by=kit", "-o", "wide"],
        crds,
        [
            "delete",
            "job,deployment,service,configmap,networkpolicy,secret",
            "-n",
            "ml",
            "-l",
            "kit.io/run-id=r3",
            "--ignore-not-found",
            "--wait=false",
        ],
        [
            "delete",
            "clusterrolebinding,validatingadmissionpolicybinding,validatingadmissionpolicy",
            "-l",
            "kit.io/run-id=r3",
            "--ignore-not-found",
        ],
    ]


def test_k8s_cli_delete_on_a_cluster_without_admission_policies(tmp_path: Path, fake_kubectl) -> None:
    """Kubernetes < 1.30 may serve no ValidatingAdmissionPolicy: the run's binding is deleted all the same."""
    path, log = fake_kubectl
    proc = run_cli(
        "delete", "RUN_ID=r3", cwd=tmp_path, path=path, extra_env={"FAKE_LOG": str(log), "FAKE_NO_VAP": "1"}
    )
    assert proc.returncode == 0, proc.stderr
    assert _calls(log)[-1] == ["delete", "clusterrolebinding", "-l", "kit.io/run-id=r3", "--ignore-not-found"]


def test_k8s_cli_reapply_keeps_the_running_jobs_token(
    tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    """A second apply of the same run (a re-render draws a new token) leaves the first Secret alone."""
    path, log = fake_kubectl
    env = {"FAKE_LOG": str(log)}
    for _ in range(2):
        proc = run_cli("apply", "RUN_ID=r3", f"OUTPUTS={outputs_file}", "--no-follow", cwd=tmp_path, path=path,
                       extra_env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    first = json.loads(Path(f"{log}.secret").read_text())["stringData"]["token"]
    assert "secret/r3-run-token kept: it exists already" in proc.stdout
    assert json.loads(Path(f"{log}.secret").read_text())["stringData"]["token"] == first
    assert not any(first in p.read_text() for p in (tmp_path / "build" / "k8s" / "r3").glob("*.yaml"))


def test_k8s_docs_are_current(tmp_path: Path) -> None:
    proc = run_cli("docs", "--check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_k8s_values_markdown_lists_every_field() -> None:
    import dataclasses

    from fsdpkit.k8s.docs import values_markdown
    from fsdpkit.k8s.values import JobValues

    table = values_markdown()
    for f in dataclasses.fields(JobValues):
        assert f"`{f.name.upper()}`" in table or f.name in ("env", "node_selector", "train")
    assert "| `ENV.<NAME>` | map |" in table
    assert textwrap.dedent(table).count("\n") == len(dataclasses.fields(JobValues)) + 2


def test_k8s_cli_image_ref_for_make_image(tmp_path: Path, outputs_file: Path) -> None:
    proc = run_cli("image-ref", "IMAGE_TAG=v3", f"OUTPUTS={outputs_file}", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (
        0,
        "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer:v3\n",
    )
    proc = run_cli("image-ref", "--region", f"OUTPUTS={outputs_file}", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "us-east-2\n")
    proc = run_cli("image-ref", "IMAGE_TAG=a/b", f"OUTPUTS={outputs_file}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: IMAGE_TAG=a/b: a Docker tag is")


def test_k8s_cli_unknown_dry_run_spelling_never_applies(
    tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    """`DRY_RUN=y` with stack outputs present must not mean "apply": a spelling the CLI does not know is a
    one-line error and kubectl is never called (a typo of a dry run must never reach the cluster)."""
    path, log = fake_kubectl
    for spelling in ("y", "dry", "2"):
        proc = run_cli("apply", "RUN_ID=r5", f"OUTPUTS={outputs_file}", f"DRY_RUN={spelling}", cwd=tmp_path,
                       path=path, extra_env={"FAKE_LOG": str(log)})  # fmt: skip
        assert proc.returncode == 2
        assert (
            proc.stderr
            == f"error: DRY_RUN='{spelling}': not a boolean; use one of 1/true/yes/on or 0/false/no/off\n"
        )
    assert not log.exists() and not (tmp_path / "build").exists()


IGNORED_KEYS = [
    (["delete", "RUN_ID=r7", "DRY_RUN=1"], "error: delete does not take DRY_RUN=1: it has no dry run"),
    (["status", "TIMEOUT=5"], "error: status does not take TIMEOUT=5: it takes RUN_ID=<id> and NAMESPACE"),
    (
        ["render", "RUN_ID=r7", "WORKDIR=w"],
        "error: render does not take WORKDIR=w: it takes DRY_RUN, OUT, OUTPUTS",
    ),
    (["local", "RUN_ID=r7", "--outputs", "x.json"], "error: local does not take --outputs: the local runner"),
    (
        ["image-ref", "IMAGE_TAG=v1", "DRY_RUN=1"],
        "error: image-ref does not take DRY_RUN=1: it takes OUTPUTS",
    ),
]


@pytest.mark.parametrize(("args", "message"), IGNORED_KEYS, ids=[" ".join(a) for a, _ in IGNORED_KEYS])
def test_a_key_the_command_would_ignore_is_refused_and_nothing_runs(
    args: list[str], message: str, tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    """`delete RUN_ID=x DRY_RUN=1` must not delete: each command names the CLI keys it takes, so a key it
    would ignore is refused before anything runs."""
    path, log = fake_kubectl
    proc = run_cli(*args, cwd=tmp_path, path=path, extra_env={"FAKE_LOG": str(log)})
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not log.exists() and not (tmp_path / "build").exists() and not (tmp_path / "runs").exists()


def test_dry_run_in_the_environment_is_refused_not_ignored(
    tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    """`DRY_RUN=1 python -m fsdpkit.k8s apply` must not apply: the CLI reads its arguments only, so a key in the
    environment is refused, not silently ignored."""
    path, log = fake_kubectl
    env = {"FAKE_LOG": str(log), "DRY_RUN": "1"}
    for args in (["apply", "RUN_ID=r8", f"OUTPUTS={outputs_file}"], ["delete", "RUN_ID=r8"]):
        proc = run_cli(*args, cwd=tmp_path, path=path, extra_env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            "error: DRY_RUN='1' is set in the environment, which the job CLI does not read: give DRY_RUN=1 "
            "(or --dry-run) as an argument, or unset DRY_RUN\n"
        )
    assert not log.exists() and not (tmp_path / "build").exists()
    given = run_cli("apply", "RUN_ID=r8", f"OUTPUTS={outputs_file}", "DRY_RUN=1", cwd=tmp_path, path=path,
                    extra_env=env)  # fmt: skip
    assert given.returncode == 0 and "DRY_RUN: nothing applied" in given.stdout, given.stderr
    assert not log.exists()


TRAINER_REFUSES = [
    (
        ["TRAIN.optim.bogus=1"],
        "error: the trainer refuses this config: unknown config key optim.bogus; valid keys in 'optim': optim.lr, "
        "optim.min_lr, optim.warmup_steps, optim.weight_decay, optim.grad_clip, optim.beta1, optim.beta2\n",
    ),
    (
        ["TRAIN.optim.lr=abc", "DRY_RUN=1"],
        "error: the trainer refuses this config: optim.lr='abc': not a number; pass a number\n",
    ),
    (
        ["TRAIN.training.stop_at=50", "STEPS=20", "DRY_RUN=1"],
        "error: the trainer refuses this config: training.stop_at must be in [0, training.steps=20] (0 = no early "
        "stop), got 50\n",
    ),
]


@pytest.mark.parametrize(("items", "message"), TRAINER_REFUSES, ids=["bogus-key", "lr-abc", "stop-at"])
def test_k8s_cli_trainer_rules_run_before_anything_is_applied(
    items: list[str], message: str, tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    """Overrides the trainer would refuse in the pod (exit 78 after a p5 node was scheduled) fail at render
    time with the trainer's own message, on apply and on DRY_RUN alike; nothing is written or applied."""
    path, log = fake_kubectl
    proc = run_cli("apply", "RUN_ID=r6", f"OUTPUTS={outputs_file}", *items, cwd=tmp_path, path=path,
                   extra_env={"FAKE_LOG": str(log)})  # fmt: skip
    assert (proc.returncode, proc.stderr) == (2, message)
    assert not log.exists() and not (tmp_path / "build").exists()


# Each rule of ENTRYPOINT and IMAGE through `apply ... DRY_RUN=1` and a real apply: one line, exit 2, nothing
# written or applied (tests/k8s/test_k8s_entrypoint.py has every rule's exact text).
ENTRYPOINT_REFUSED = [
    (
        ["ENTRYPOINT=python train.py --name 'a b"],
        "error: ENTRYPOINT=python train.py --name 'a b: is not a command line (No closing quotation)",
    ),
    (["ENTRYPOINT=''"], "error: ENTRYPOINT='': names no program"),
    (
        ["ENTRYPOINT=python t.py\udcff"],
        "error: override ENTRYPOINT=python t.py\\udcff holds bytes that are not UTF-8",
    ),
    (["ENTRYPOINT=--foo"], "error: ENTRYPOINT=--foo: starts with an option (--foo)"),
    (["ENTRYPOINT=$(PY) t.py"], "error: ENTRYPOINT=$(PY) t.py: the program '$(PY)' holds '$('"),
    (["ENTRYPOINT=python -m"], "error: ENTRYPOINT=python -m: python -m needs a module name"),
    (
        ["ENTRYPOINT=python -m my-pkg.train"],
        "error: ENTRYPOINT=python -m my-pkg.train: -m my-pkg.train: a module name is dotted",
    ),
    (
        ["ENTRYPOINT=python -m my.train", "MODEL=small"],
        "error: MODEL=small: is the kit trainer's; with ENTRYPOINT your script chooses its model",
    ),
    (
        ["ENTRYPOINT=python -m my.train", "TRAIN.optim.lr=1e-4"],
        "error: TRAIN.optim.lr=0.0001: is the kit trainer's",
    ),
    (
        ["IMAGE=reg.example/My-Train:v1"],
        "error: IMAGE=reg.example/My-Train:v1: is not an image reference [REGISTRY[:PORT]/]PATH[:TAG][@sha256:<64 hex>]",
    ),
    (
        ["IMAGE=reg.example/train@sha256:123"],
        "error: IMAGE=reg.example/train@sha256:123: is not an image reference",
    ),
]


# Every row as DRY_RUN=1; a few as a real apply too (the same check runs before kubectl either way).
_REFUSED_CASES = [(*row, True) for row in ENTRYPOINT_REFUSED] + [
    (*ENTRYPOINT_REFUSED[i], False) for i in (0, 4, 8, 10)
]


@pytest.mark.parametrize(("items", "message", "dry_run"), _REFUSED_CASES,
                         ids=[f"{'dry' if d else 'apply'}:{i[-1][:30]}" for i, _, d in _REFUSED_CASES])  # fmt: skip
def test_k8s_cli_bad_entrypoint_or_image_applies_nothing(
    items: list[str], message: str, dry_run: bool, tmp_path: Path, outputs_file: Path, fake_kubectl
) -> None:
    path, log = fake_kubectl
    proc = run_cli("apply", "RUN_ID=r8", f"OUTPUTS={outputs_file}", *items, *(["DRY_RUN=1"] if dry_run else []),
                   cwd=tmp_path, path=path, extra_env={"FAKE_LOG": str(log)})  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(message) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not log.exists() and not (tmp_path / "build").exists()


def test_k8s_cli_renders_a_users_entrypoint_and_image(tmp_path: Path, outputs_file: Path) -> None:
    image = "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1"
    proc = run_cli("apply", "RUN_ID=r9", f"OUTPUTS={outputs_file}", "DRY_RUN=1", f"IMAGE={image}",
                   "ENTRYPOINT=python -m myproject.train --cfg 'a b'", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "build" / "k8s" / "r9"
    job = yaml.safe_load((out / "06-job.yaml").read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image and container["command"][-4:] == [
        "-m",
        "myproject.train",
        "--cfg",
        "a b",
    ]
    store = yaml.safe_load((out / "05-rdzv-store.yaml").read_text())
    assert store["spec"]["template"]["spec"]["containers"][0]["image"] == image
    config = yaml.safe_load(yaml.safe_load((out / "04-configmap.yaml").read_text())["data"]["train.yaml"])
    assert set(config) == {"run", "training", "checkpoint", "inprocess"}
    assert "memory plan" not in proc.stdout  # the kit trainer's model's plan: not the script's


def test_k8s_make_passes_an_entrypoint_with_spaces_and_quotes(tmp_path: Path) -> None:
    """make escapes the spaces of `ENTRYPOINT="..."` in $(MAKEOVERRIDES); the recipe's shell hands the CLI one
    argument, and shlex splits it as the user wrote it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ENTRYPOINT", None)
    proc = _make(tmp_path, "train-local", "RUN_ID=mk", "DRY_RUN=1", f"OUT={tmp_path / 'out'}",
                 "ENTRYPOINT=python examples/hf_llama/train.py --steps 20 --name 'a b'", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = yaml.safe_load((tmp_path / "out" / "06-job.yaml").read_text())
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-5:] == ["examples/hf_llama/train.py", "--steps", "20", "--name", "a b"]
    twice = _make(tmp_path, "train-local", "RUN_ID=mk", "DRY_RUN=1", "ENTRYPOINT=python a.py",
                  "ENTRYPOINT=python b.py", env=env)  # fmt: skip
    assert twice.returncode == 2 and twice.stderr.startswith(
        "error: ENTRYPOINT is given twice on the make command line (ENTRYPOINT=python a.py, then "
        "ENTRYPOINT=python b.py)"
    ), twice.stderr


def test_k8s_cli_trainer_fields_k8s_does_not_list_still_pass(tmp_path: Path) -> None:
    """The trainer's rules, not a k8s copy of its field list: optim.beta1 is the trainer's, so it renders."""
    proc = run_cli("render", "RUN_ID=r7", "TRAIN.optim.beta1=0.8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "beta1: 0.8" in (tmp_path / "build" / "k8s" / "r7" / "04-configmap.yaml").read_text()


def test_k8s_cli_many_nodes_without_outputs_warn(tmp_path: Path, outputs_file: Path) -> None:
    bare = tmp_path / "before-deploy"  # no cdk-outputs.json here
    bare.mkdir()
    proc = run_cli("render", "RUN_ID=big", "NODES=1000", cwd=bare)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "warning: NODES=1000: 8000 ranks, and without stack outputs the node group's size is unknown (more than "
        "64 nodes is rarely meant); check NODES, or pass OUTPUTS=<file> so GpuNodeCount bounds it"
    )
    # the plan's advice: at 1,000 nodes a loss every few hours waits 900 s for its replacement without spares
    assert "warning: SPARES=0: a lost node finds no spare with probability 100%" in proc.stderr
    quiet = run_cli("render", "RUN_ID=few", "NODES=64", cwd=bare)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
    bounded = run_cli("render", "RUN_ID=big", "NODES=1000", f"OUTPUTS={outputs_file}", cwd=tmp_path)
    assert bounded.returncode == 2
    assert bounded.stderr.startswith(
        "error: NODES=1000: the GPU node group has 4 nodes; ask for at most that many"
    )


def test_k8s_make_train_job_refuses_a_key_given_twice(tmp_path: Path) -> None:
    """make keeps only the last `NODES=` of its command line; the CLI reads make's own argv to refuse it.
    The setup stamp is marked old-but-fine (-o), so make runs only the recipe."""
    stamp = tmp_path / "stamp"
    stamp.touch()
    for pairs in (["NODES=4", "NODES=5"], ["NODES=4", "nodes=5"]):  # make collapses the first, not the second
        proc = subprocess.run(
            ["make", "--no-print-directory", "-C", str(REPO), "-o", str(stamp), f"STAMP={stamp}",
             f"PY={sys.executable}", "train-job", *pairs, "DRY_RUN=1", f"OUT={tmp_path / 'out'}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.lower().startswith("error: nodes is given twice"), proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def _make(tmp_path: Path, target: str, *pairs: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    stamp = tmp_path / "stamp"
    stamp.touch()
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "-o", str(stamp), f"STAMP={stamp}",
         f"PY={sys.executable}", target, *pairs],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_k8s_make_refuses_a_key_in_its_environment(tmp_path: Path, fake_kubectl) -> None:
    """make passes on only its command line's values, so `DRY_RUN=1 make train-job` would apply and
    `NODES=8 make train-job` would render the default. The CLI reads make's environment and refuses both;
    a key given on the command line (which make also exports) is fine."""
    path, log = fake_kubectl
    base = {k: v for k, v in os.environ.items() if k.upper() not in {"DRY_RUN", "NODES", "OUT", "RUN_ID"}}
    base.update(PATH=path, FAKE_LOG=str(log), PYTHONPATH=str(REPO))
    out = f"OUT={tmp_path / 'out'}"
    for key, value in (("DRY_RUN", "1"), ("NODES", "8")):
        proc = _make(tmp_path, "train-job", "RUN_ID=r9", out, env={**base, key: value})
        assert proc.returncode == 2, proc.stdout + proc.stderr
        first = proc.stderr.splitlines()[0]
        assert first == (
            f"error: {key}='{value}' is set in the environment, and make passes on only its command line's "
            f"values: give it after the target (make train-job {key}={value}) or unset {key}"
        )
    assert not log.exists() and not (tmp_path / "out").exists()
    proc = _make(tmp_path, "train-job", "RUN_ID=r9", "NODES=2", "DRY_RUN=1", out, env=base)
    assert proc.returncode == 0 and "DRY_RUN: nothing applied" in proc.stdout, proc.stderr
    deleted = _make(tmp_path, "train-job-delete", "RUN_ID=r9", env={**base, "DRY_RUN": "1"})
    assert deleted.returncode == 2 and "DRY_RUN='1' is set in the environment" in deleted.stderr
    assert not log.exists()


def test_k8s_cli_local_dry_run_runs_nothing(tmp_path: Path) -> None:
    proc = run_cli("local", "DRY_RUN=1", "RUN_ID=dry", "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DRY_RUN: nothing run" in proc.stdout
    assert not (tmp_path / "work").exists()  # no pod started, no volume prepared
