"""The local runner: the rendered `local` Job's pods run here as processes, with the cluster's env, volumes
and failure rules; the slow test trains 2 pods x 1 process through a SIGKILL fault to the goodput report."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import psutil
import pytest

from fsdpkit.k8s.local import LocalRunError, LocalRunner, PathMap, expand_vars, load_job, run_local
from fsdpkit.k8s.render import Manifest, render
from fsdpkit.k8s.spec import POD_WRAPPER, WORKER_WRAPPER
from fsdpkit.k8s.values import build_values

REPO = Path(__file__).resolve().parents[2]


def _local(*overrides: str) -> list[Manifest]:
    return render(build_values(overrides=["PROFILE=local", "RUN_ID=loc", *overrides]))


def _with_command(manifests: list[Manifest], command: list[str]) -> list[Manifest]:
    out = []
    for m in manifests:
        obj = copy.deepcopy(m.obj)
        if obj["kind"] == "Job":
            obj["spec"]["template"]["spec"]["containers"][0]["command"] = command
        out.append(Manifest(m.filename, m.text, obj))
    return out


def _rjobs(manifests: list[Manifest]) -> tuple[list[Manifest], dict[str, dict]]:
    """A deep copy of the manifests and the JobSet's replicated jobs in it (KIND=jobset, or the TrainJob's
    runtime), by name, to edit in place."""
    out = [Manifest(m.filename, m.text, copy.deepcopy(m.obj)) for m in manifests]
    for m in out:
        if m.obj["kind"] == "JobSet":
            return out, {r["name"]: r for r in m.obj["spec"]["replicatedJobs"]}
        if m.obj["kind"] == "ClusterTrainingRuntime":
            return out, {r["name"]: r for r in m.obj["spec"]["template"]["spec"]["replicatedJobs"]}
    raise AssertionError("no JobSet in the manifests")


def _kind_with_command(manifests: list[Manifest], command: list[str]) -> list[Manifest]:
    out, rjobs = _rjobs(manifests)
    rjobs["node"]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = command
    return out


def test_k8s_path_map_replaces_whole_mount_paths_only(tmp_path: Path) -> None:
    paths = PathMap({"/fsx": tmp_path / "v", "/etc/kit": tmp_path / "c"})
    assert paths("--run-dir=/fsx/runs/a") == f"--run-dir={tmp_path}/v/runs/a"
    assert paths("/fsx") == str(tmp_path / "v")
    assert paths("/fsxdata/x /data/fsx/y") == "/fsxdata/x /data/fsx/y"
    assert paths("root: /fsx/runs\n") == f"root: {tmp_path}/v/runs\n"


def test_k8s_expand_vars_like_kubelet() -> None:
    env = {"NODE_RANK": "3"}
    assert expand_vars("--node-rank=$(NODE_RANK)", env) == "--node-rank=3"
    assert expand_vars("$$(NODE_RANK) $(UNSET)", env) == "$(NODE_RANK) $(UNSET)"


def test_k8s_local_runner_refuses_eks_profiles() -> None:
    manifests = render(build_values(overrides=["RUN_ID=t"], allow_placeholders=True))
    with pytest.raises(
        LocalRunError, match=r"^the local runner runs PROFILE=local manifests; these are for 'p5'"
    ):
        load_job(manifests)


def test_k8s_local_config_file_points_at_local_folders(tmp_path: Path) -> None:
    runner = LocalRunner(load_job(_local()), workdir=tmp_path)
    config = (tmp_path / "configmaps" / "loc-config" / "train.yaml").read_text()
    assert f"root: {tmp_path}/volumes/kit-local-runs/runs" in config
    env = runner.pod_env(1, "loc-1-x")
    assert env["RUN_DIR"] == f"{tmp_path}/volumes/kit-local-runs/runs/loc"
    assert env["KIT_CONFIG"] == f"{tmp_path}/configmaps/loc-config/train.yaml"
    argv = runner.pod_argv(env)
    assert argv[0] == sys.executable and argv[-1] == env["KIT_CONFIG"]


# A stand-in container command: exits with the code listed for its node rank in <runs>/codes.json on its
# first attempt (a replacement pod exits 0), so the Job's failure rules can be checked in a second.
PROBE = (
    "import json, os, pathlib, sys; "
    "d = pathlib.Path(os.environ['RUN_DIR']); d.mkdir(parents=True, exist_ok=True); "
    "rank = os.environ['NODE_RANK']; mark = d / ('tried-' + rank); "
    "code = json.loads((d.parent / 'codes.json').read_text()).get(rank, 0); "
    "first = not mark.exists(); mark.touch(); "
    "sys.exit(code if (first or code == 78) else 0)"
)


def _probe(tmp_path: Path, codes: dict[int, int], backoff: int):
    runs = tmp_path / "volumes" / "kit-local-runs" / "runs"
    runs.mkdir(parents=True)
    (runs / "codes.json").write_text(json.dumps({str(k): v for k, v in codes.items()}))
    manifests = _with_command(
        _local("NODES=2", f"BACKOFF_LIMIT_PER_INDEX={backoff}"), ["python", "-c", PROBE]
    )
    return run_local(manifests, workdir=tmp_path, timeout_s=60)


def test_k8s_local_job_succeeds_when_every_index_exits_0(tmp_path: Path) -> None:
    result = _probe(tmp_path, {}, backoff=0)
    assert result.succeeded and [p.exit_code for p in result.pods] == [0, 0]


def test_k8s_local_failed_pod_is_replaced_within_backoff(tmp_path: Path) -> None:
    result = _probe(tmp_path, {1: 75}, backoff=1)
    assert result.succeeded
    assert [(p.name, p.exit_code) for p in result.pods if p.index == 1] == [
        ("loc-1-local", 75),
        ("loc-1-local-r1", 0),
    ]


def test_k8s_local_index_out_of_backoff_fails_the_job(tmp_path: Path) -> None:
    result = _probe(tmp_path, {1: 75}, backoff=0)
    assert not result.succeeded
    assert result.reason == "index 1 failed 1 times (backoffLimitPerIndex 0); last exit code 75"


def test_k8s_local_exit_78_fails_the_job_at_once(tmp_path: Path) -> None:
    result = _probe(tmp_path, {0: 78}, backoff=5)
    assert not result.succeeded and result.reason == "pod loc-0-local exited 78 (FailJob)"
    assert len([p for p in result.pods if p.index == 0]) == 1


# Exits 0 only if the rendezvous store's port answers as it starts and its hostname is the JobSet's.
STORE_UP = (
    "import os, socket, sys; "
    "socket.create_connection(('127.0.0.1', int(os.environ['MASTER_PORT'])), timeout=5).close(); "
    "sys.exit(0 if os.environ['HOSTNAME'] == 'loc-node-0-' + os.environ['NODE_RANK'] else 3)"
)


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_k8s_local_runs_each_kinds_pods_after_its_store_is_ready(tmp_path: Path, kind: str) -> None:
    """The JobSet's `node` Job (or the TrainJob's runtime's) runs once its `rdzv` store is Ready
    (dependsOn): every trainer reaches the store at its first try, with the JobSet's pod hostnames."""
    manifests = _kind_with_command(_local(f"KIND={kind}", "NODES=2"), ["python", "-c", STORE_UP])
    result = run_local(manifests, workdir=tmp_path, timeout_s=120)
    assert result.succeeded, (result.reason, [p.log.read_text() for p in result.pods])
    assert [(p.name, p.exit_code) for p in result.pods] == [
        ("loc-node-0-0-local", 0),
        ("loc-node-0-1-local", 0),
    ]
    assert (
        "kit-store: serving the rendezvous on 127.0.0.1"
        in (tmp_path / "logs" / "loc-rdzv-0-local.log").read_text()
    )


def _kind_probe(tmp_path: Path, kind: str, codes: dict[int, int], backoff: int):
    """_probe on KIND=jobset/trainjob (LAUNCHER=torchrun: no store pod to wait for)."""
    runs = tmp_path / "volumes" / "kit-local-runs" / "runs"
    runs.mkdir(parents=True)
    (runs / "codes.json").write_text(json.dumps({str(k): v for k, v in codes.items()}))
    manifests = _local(f"KIND={kind}", "LAUNCHER=torchrun", "NODES=2", f"BACKOFF_LIMIT_PER_INDEX={backoff}")
    return run_local(_kind_with_command(manifests, ["python", "-c", PROBE]), workdir=tmp_path, timeout_s=60)


def test_k8s_local_jobset_fails_at_once_on_exit_78_by_its_rule(tmp_path: Path) -> None:
    result = _kind_probe(tmp_path, "jobset", {0: 78}, backoff=5)
    assert not result.succeeded and result.reason == (
        "pod loc-node-0-0-local exited 78 (FailJob); JobSet loc failed: its Job 'node' failed "
        "(PodFailurePolicy), failurePolicy rule FatalExit (FailJobSet)"
    )
    assert len([p for p in result.pods if p.index == 0]) == 1  # no retry, no restart of the set


def test_k8s_local_trainjob_index_out_of_retries_fails_by_its_rule(tmp_path: Path) -> None:
    result = _kind_probe(tmp_path, "trainjob", {1: 75}, backoff=0)
    assert not result.succeeded and result.reason == (
        "index 1 failed 1 times (backoffLimitPerIndex 0); last exit code 75; TrainJob loc failed: its Job "
        "'node' failed (MaxFailedIndexesExceeded), failurePolicy rule RetriesSpent (FailJobSet)"
    )


def test_k8s_local_jobset_replaces_a_failed_pod_in_its_index(tmp_path: Path) -> None:
    result = _kind_probe(tmp_path, "jobset", {1: 75}, backoff=1)
    assert result.succeeded, result.reason
    assert [(p.name, p.exit_code) for p in result.pods if p.index == 1] == [
        ("loc-node-0-1-local", 75),
        ("loc-node-0-1-local-r1", 0),
    ]
    assert [p.name for p in result.pods if p.index == 0] == ["loc-node-0-0-local"]  # never restarted


def test_k8s_local_store_out_of_retries_fails_the_jobset(tmp_path: Path) -> None:
    """The `rdzv` Job replaces a failed store pod up to its backoffLimit; then RetriesSpent fails the set,
    and no trainer ever started (they wait for the store to be Ready)."""
    out, rjobs = _rjobs(_local("KIND=jobset", "NODES=2"))
    store = rjobs["rdzv"]["template"]["spec"]
    store["backoffLimit"] = 1
    store["template"]["spec"]["containers"][0]["command"] = ["python", "-c", "raise SystemExit(1)"]
    result = run_local(out, workdir=tmp_path, timeout_s=60)
    assert not result.succeeded and result.reason == (
        "the rendezvous store's Job failed 2 times (backoffLimit 1); last exit code 1; JobSet loc failed: "
        "its Job 'rdzv' failed (BackoffLimitExceeded), failurePolicy rule RetriesSpent (FailJobSet)"
    )
    assert result.pods == []
    assert sorted(f.name for f in (tmp_path / "logs").iterdir()) == [
        "loc-rdzv-0-local-r1.log",
        "loc-rdzv-0-local.log",
    ]


def test_k8s_local_trainjob_runs_its_num_nodes() -> None:
    manifests = [
        Manifest(m.filename, m.text, copy.deepcopy(m.obj)) for m in _local("KIND=trainjob", "NODES=2")
    ]
    (tj,) = [m.obj for m in manifests if m.obj["kind"] == "TrainJob"]
    assert load_job(manifests).completions == 2  # the runtime's mlPolicy.numNodes
    tj["spec"]["trainer"] = {"numNodes": 3}
    job = load_job(manifests)
    assert (job.name, job.completions, job.store_host) == (
        "loc-node-0",
        3,
        "loc-rdzv.kit-training.svc.cluster.local",
    )


def _broken(kind: str, edit) -> list[Manifest]:
    manifests = [Manifest(m.filename, m.text, copy.deepcopy(m.obj)) for m in _local(f"KIND={kind}")]
    edit({m.obj["kind"]: m.obj for m in manifests})
    return [m for m in manifests if m.obj]


KIND_ERRORS = {
    "jobset-without-node": (
        "jobset",
        lambda o: o["JobSet"]["spec"]["replicatedJobs"].pop(),
        "JobSet loc: no replicated job 'node' (the trainers) in ['rdzv']; render it again",
    ),
    "trainjob-without-runtime": (
        "trainjob",
        lambda o: o["ClusterTrainingRuntime"].clear(),
        "TrainJob loc: its ClusterTrainingRuntime 'fsdpkit-loc' is not among the manifests; render "
        "KIND=trainjob again (the kit renders the run's runtime with it)",
    ),
    "jobset-restarts": (
        "jobset",
        lambda o: o["JobSet"]["spec"]["failurePolicy"].update(maxRestarts=2),
        "JobSet loc: failurePolicy could restart the whole set (maxRestarts 2, rules []); the local runner "
        "runs FailJobSet rules only, as the kit renders them",
    ),
    "trainjob-command": (
        "trainjob",
        lambda o: o["TrainJob"]["spec"].update(trainer={"command": ["x"]}),
        "TrainJob loc: spec field(s) ['trainer.command'] are not run locally; render it again",
    ),
}


@pytest.mark.parametrize(("kind", "edit", "message"), KIND_ERRORS.values(), ids=KIND_ERRORS.keys())
def test_k8s_local_kind_errors_are_one_line(kind: str, edit, message: str) -> None:
    with pytest.raises(LocalRunError) as err:
        load_job(_broken(kind, edit))
    assert str(err.value) == message


# A pod that is lost on its first attempt (SIGKILLed as a whole, as the node fault does); every start writes
# its wall time, the lost one just before it dies.
LOST = (
    "import os, pathlib, signal, time; "
    "d = pathlib.Path(os.environ['RUN_DIR']); d.mkdir(parents=True, exist_ok=True); "
    "rank = os.environ['NODE_RANK']; starts = d / ('starts-' + rank); "
    "first = not starts.exists(); "
    "starts.open('a').write(f'{time.time()}\\n'); "
    "rank == '1' and first and os.kill(os.getpid(), signal.SIGKILL)"
)


def test_k8s_local_replaces_a_lost_pod_after_the_delay_asked_for(tmp_path: Path) -> None:
    manifests = _with_command(_local("NODES=2", "BACKOFF_LIMIT_PER_INDEX=1"), ["python", "-c", LOST])
    result = run_local(manifests, workdir=tmp_path, timeout_s=60, lost_pod_replace_after_s=1.5)
    assert result.succeeded, result.reason
    assert [(p.name, p.exit_code) for p in result.pods if p.index == 1] == [
        ("loc-1-local", -signal.SIGKILL),
        ("loc-1-local-r1", 0),
    ]
    run_dir = tmp_path / "volumes" / "kit-local-runs" / "runs" / "loc"
    lost, replacement = (float(t) for t in (run_dir / "starts-1").read_text().split())
    assert replacement - lost >= 1.5  # never before the delay (the runner kept polling pod 0 meanwhile)


def _listeners_until_exit(proc: subprocess.Popen[str]) -> tuple[set[tuple[str, str, int]], str, str]:
    """(role, address, port) of every TCP socket listening in `proc`'s process tree, sampled until it exits
    (role "store": the rendezvous store pod, "pod": a launcher or its workers), and its stdout and stderr,
    drained meanwhile (a full pipe would stall the run)."""
    texts: dict[int, str] = {}

    def drain(index: int, stream: IO[str]) -> None:
        texts[index] = stream.read()

    drained = [threading.Thread(target=drain, args=(i, s), daemon=True) for i, s in enumerate(
        (proc.stdout, proc.stderr))]  # fmt: skip
    for thread in drained:
        thread.start()
    seen: set[tuple[str, str, int]] = set()
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmd = " ".join(child.cmdline())
                    role = "store" if "launcher.store" in cmd else "pod"
                    for conn in child.net_connections(kind="tcp"):
                        if conn.status == psutil.CONN_LISTEN:
                            seen.add((role, conn.laddr.ip, conn.laddr.port))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    for thread in drained:
        thread.join(timeout=60)
    return seen, texts.get(0, ""), texts.get(1, "")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_k8s_local_job_survives_a_kill_fault_and_reports_goodput(tmp_path: Path) -> None:
    """2 pods x 1 process from the rendered manifests; rank 1 is SIGKILLed at step 12; the kit launcher
    restarts the group, the run resumes from the step-10 checkpoint and completes; the report reads it.
    With in-process restart on, rank 0 survives the kill in its restart barrier, so only one node spends a
    restart: the nodes must still meet in the new round (their restart counts differ, so a key scope built
    from them would leave them waiting on each other's keys forever: training/runtime/distributed.py,
    `store_scope`), and pod 0's launcher stops its restarting rank at once.
    (With it off, a 2-pod group restart after a kill is the node-fault tests' and the demo's path.)
    KIND=jobset: the pods come from the JobSet's `node` Job, the store from its `rdzv` Job (the Job's kill
    path is run by tests/k8s/test_k8s_node_faults.py)."""
    inprocess = "true"
    metrics = pytest.importorskip("fsdpkit.analysis.metrics")
    runner = subprocess.Popen(
        [sys.executable, "-m", "fsdpkit.k8s", "local", "NODES=2", "STEPS=20", "CHECKPOINT_INTERVAL=5",
         f"INPROCESS={inprocess}", "FAULT_SPEC=kill:step=12:rank=1", "RUN_ID=kill-e2e", "KIND=jobset",
         "--workdir", str(tmp_path), "--timeout", "300"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    listeners, out, err = _listeners_until_exit(runner)
    proc = subprocess.CompletedProcess(runner.args, runner.returncode, out, err)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Every TCP listener of the run (the rendezvous store pod, the workers' and in-process stores, gloo's
    # pairs) was on the loopback address: nothing of a local run is on the machine's network.
    assert any(role == "store" for role, _, _ in listeners), listeners
    assert len({port for role, _, port in listeners if role == "pod"}) >= 2, listeners  # stores, gloo pairs
    assert {ip for _, ip, _ in listeners} <= {"127.0.0.1", "::1"}, listeners
    assert "local job completed" in proc.stdout and "goodput" in proc.stdout
    run_dir = tmp_path / "kill-e2e" / "volumes" / "kit-local-runs" / "runs" / "kill-e2e"
    m = metrics.load_run_metrics(run_dir)
    assert (m.world_size, m.steps_completed) == (2, 20)
    assert [(f.kind, f.step, f.rank) for f in m.faults] == [("kill", 12, 1)]
    assert m.faults[0].recovery_s is not None and m.faults[0].recovery_s > 0
    assert 0 < m.goodput <= 1
    assert (run_dir / "timeline.png").is_file()
    # Rank 0 was restarting in process (its peer was gone) when pod 0's launcher saw the new round: nothing to
    # drain, so SIGKILL at once (a SIGTERM would hold the round for torchelastic's 30 s shutdown timeout).
    # On a loaded machine the launcher can look before rank 0 has noticed the lost peer (still in its train
    # phase): the SIGTERM then reaches a rank about to restart in process, which leaves at once when asked to
    # stop (in its settle or its restart barrier). Either way, no 30 s hold.
    logs = tmp_path / "kill-e2e" / "logs"
    assert sorted(f.name for f in logs.iterdir()) == [
        "kill-e2e-node-0-0-local.log", "kill-e2e-node-0-1-local.log", "kill-e2e-rdzv-0-local.log"
    ]  # fmt: skip  # no pod restarted: the kill was recovered inside the pods
    pod0 = (logs / "kill-e2e-node-0-0-local.log").read_text()
    assert (
        "outside the train loop (starting, loading or restarting in process), nothing to drain" in pod0
        or "asked to stop (SIGTERM) while" in pod0
    ), pod0[-3000:]
    assert "forcefully exiting via 9" not in pod0


@pytest.mark.timeout(200)
def test_k8s_local_torchrun_keeps_the_trainers_exit_78(tmp_path: Path) -> None:
    """torchrun turns a worker's 78 into 1; the rendered wrappers give the pod 78 back, so the Job's FailJob
    rule fires at once instead of retrying the index. The shard folder is missing, a check the trainer
    makes in the pod (render time cannot see the pod's FSx), so the trainer exits 78 before any group."""
    manifests = _local("LAUNCHER=torchrun", "NODES=1", "DATA_KIND=shards", "DATA_PATH=/fsx/data/none",
                       "BACKOFF_LIMIT_PER_INDEX=2")  # fmt: skip
    result = run_local(manifests, workdir=tmp_path, timeout_s=150)
    log = result.pods[0].log.read_text()
    assert not result.succeeded and result.reason == "pod loc-0-local exited 78 (FailJob)", log[-2000:]
    assert [p.exit_code for p in result.pods] == [78]  # not retried
    assert "data.path=" in log and "is not a folder" in log


# Waits for SIGTERM, then exits with a code of its own: the wrappers must return that code, not 143.
TERM_CHILD = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
    "print('up', flush=True); time.sleep(60); sys.exit(3)"
)


def _started(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"


def test_k8s_worker_wrapper_waits_for_the_trainer_and_marks_78(tmp_path: Path) -> None:
    """torchrun signals the worker's process group: the wrapper must outlive the trainer (a drain's last
    checkpoint) and pass its code on; exit 78 leaves the mark the pod wrapper looks for."""
    mark = tmp_path / "mark"
    env = {
        **os.environ,
        "KIT_EXIT78_MARK": str(mark),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.Popen(["sh", "-c", WORKER_WRAPPER, "kit-worker", "-c", TERM_CHILD], env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    _started(proc)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 42 and not mark.exists()
    code = subprocess.run(["sh", "-c", WORKER_WRAPPER, "kit-worker", "-c", "raise SystemExit(78)"], env=env,
                          timeout=30).returncode  # fmt: skip
    assert code == 78 and mark.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_k8s_pod_wrapper_as_pid_1_forwards_sigterm(tmp_path: Path) -> None:
    """In a container the kubelet signals PID 1 only: the pod wrapper, PID 1 of a new PID namespace here,
    must hand SIGTERM to the launcher (a drain) and return the launcher's own exit code."""
    proc = subprocess.Popen(
        ["unshare", "--fork", "--pid", "--mount-proc", "sh", "-c", POD_WRAPPER, "kit-pod",
         sys.executable, "-c", TERM_CHILD],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    _started(proc)
    (pid1,) = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(proc.pid)], text=True).split()]
    os.kill(pid1, signal.SIGTERM)  # the wrapper alone, as the kubelet would
    assert proc.wait(timeout=30) == 42
