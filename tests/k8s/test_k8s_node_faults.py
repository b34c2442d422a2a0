"""Whole-node faults through the rendered manifests and the local runner (real processes, gloo on CPU).

2 pods x 1 rank (+1 hot spare): a `node` fault (the pod's every process SIGKILLed at once) or a `drain`
(SIGTERM, SIGKILL after the grace period) on pod 1 or on pod 0, the pod that hosts torchrun's rendezvous
(the kit's store runs in a pod of its own, so losing pod 0 must not end the job).
Each run must finish with its final checkpoint, verified and loaded back from disk
(training/resilience/checkpoint/compare.py), bitwise equal to a fault-free run's, and a drain must lose no
step.
Without spares the lost pod is recreated, as the Job controller would, and the job still finishes.
The runs are spread over the three renderings (KIND): the reference and most faults on the Job, a node loss
with a spare and a drain under NVRx on the JobSet, a drain with a spare, a given-up node (a kill) and a
node loss without a spare on the TrainJob; each still equals the Job's fault-free run bitwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from fsdpkit.analysis import metrics
from fsdpkit.analysis.report import straggler_lines, world_line
from fsdpkit.k8s.kinds import trainer_job_name
from fsdpkit.ops.cost.faults import fault_cost
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
JOB = ["NODES=2", "STEPS=10", "CHECKPOINT_INTERVAL=4", "CHECKPOINT_MODE=sync", "MONITOR_INTERVAL_S=0.1"]
FAULT_STEP = 6


def run_job(
    tmp: Path,
    run_id: str,
    *overrides: str,
    job: list[str] = JOB,
    flags: tuple[str, ...] = (),
    during: Callable[[subprocess.Popen[str], Path], None] | None = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`python -m fsdpkit.k8s local` as a user runs it (`during(process, run folder)` on a thread while it
    runs);
    returns the process and the run folder."""
    run_dir = tmp / run_id / "volumes" / "kit-local-runs" / "runs" / run_id
    argv = [sys.executable, "-m", "fsdpkit.k8s", "local", *job, *overrides, f"RUN_ID={run_id}",
            "--workdir", str(tmp), "--timeout", "240", *flags]  # fmt: skip
    popen = subprocess.Popen(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    if during is not None:
        threading.Thread(target=during, args=(popen, run_dir), daemon=True).start()
    out, err = popen.communicate(timeout=280)
    proc = subprocess.CompletedProcess(argv, popen.returncode, out, err)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc, run_dir


def kill_the_store_at(step: int) -> Callable[[subprocess.Popen[str], Path], None]:
    """SIGKILL the job's rendezvous store pod once the trainer reported `step` (its Deployment recreates it:
    the local runner starts it again on the same port)."""

    def act(job: subprocess.Popen[str], run_dir: Path) -> None:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and job.poll() is None:
            with contextlib.suppress(metrics.MetricsError, OSError):
                if any(
                    e["kind"] == "step" and e.get("step", 0) >= step for e in metrics.load_events(run_dir)
                ):
                    break
            time.sleep(0.05)
        for child in psutil.Process(job.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "fsdpkit.launcher.store" in child.cmdline():
                    child.kill()

    return act


def assert_same_model(run_dir: Path, reference: Path) -> None:
    """The persisted final checkpoints, verified and loaded back from disk, are bitwise equal."""
    result = compare_checkpoints(final_checkpoint(run_dir), final_checkpoint(reference))
    assert result.equal, result.summary()
    assert {"model", "optim"} <= result.groups


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fault-free run's folder (same job, no fault, no spare)."""
    return run_job(tmp_path_factory.mktemp("ref"), "ref")[1]


def _launcher_events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in metrics.load_events(run_dir) if e["kind"] == kind and e.get("role") == "launcher"]


def _replaced_indexes(logs: Path, pods: str) -> set[int]:
    """The trainer indexes that got a second pod (the runner's logs `<pods>-<index>-local-r<n>.log`)."""
    pattern = re.compile(rf"{re.escape(pods)}-(\d+)-local-r\d+\.log")
    return {int(m.group(1)) for f in logs.iterdir() if (m := pattern.fullmatch(f.name))}


# A drain is the same per-pod SIGTERM on pod 0 as on pod 1 (the rendezvous lives in its own pod, and every
# rank agrees on the step through the loss all-reduce), so it runs on pod 1 only; a lost node on both. Each
# runs on another KIND, compared with the Job's fault-free run.
@pytest.mark.parametrize(
    ("owner", "kind", "node"), [("job", "node", 1), ("jobset", "node", 0), ("trainjob", "drain", 1)]
)
def test_node_fault_with_a_spare_finishes_bitwise_equal(
    tmp_path: Path, fault_free: Path, owner: str, kind: str, node: int
) -> None:
    run_id = f"{kind}{node}"
    pods = trainer_job_name(owner, run_id)  # the trainers' Job: <run id>, or the JobSet's <run id>-node-0
    # The node-1 run also loses the rendezvous store at step 2 (its pod rescheduled): training goes on with
    # no restart, the agents reach the new store, and the node loss's membership change works through it.
    store_lost = (kind, node) == ("node", 1)
    proc, run_dir = run_job(
        tmp_path, run_id, f"KIND={owner}", "SPARES=1", f"FAULT_SPEC={kind}:step={FAULT_STEP}:node={node}",
        during=kill_the_store_at(2) if store_lost else None,
    )  # fmt: skip
    assert_same_model(run_dir, fault_free)
    assert "local job completed" in proc.stdout
    if store_lost:
        assert "rendezvous store pod exited" in proc.stdout
        assert _launcher_events(run_dir, "rdzv_store_reconnected")
        fault_ts = min(e["ts"] for e in metrics.load_events(run_dir) if e["kind"] == "fault")
        assert all(e["ts"] > fault_ts for e in _launcher_events(run_dir, "restart"))  # none for the store
    m = metrics.load_run_metrics(run_dir)
    assert (m.world_size, m.steps_completed) == (2, 10)
    assert [(f.kind, f.step) for f in m.faults] == [(kind, FAULT_STEP)]
    # the spare was started warm and either replaced the lost pod or, left over, exited 0 (the runner's
    # success means every index, spares included, ended with exit 0)
    assert _launcher_events(run_dir, "spare_waiting")
    assert _launcher_events(run_dir, "spare_exit")  # 3 pods were left for 2 places: one exited 0 unused
    # The lost or drained node's state came from its buddy's memory, the survivor's from its own: nothing
    # was read from the shared checkpoint folder. With the store lost just before the node (node-1), the
    # replacement pod and the spare can reach the restarted store and form its first round before the
    # survivor is back (a known race of the store's restart, docs/launcher.md): two fresh nodes hold no
    # memory copy, so that round reads shared storage; the model is still bitwise equal (above).
    source = (m.faults[0].resume_source, m.faults[0].shared_bytes)
    assert source == ("peer", 0) or (store_lost and source[0] == "shared"), source
    logs = tmp_path / run_id / "logs"
    lost = (logs / f"{pods}-{node}-local.log").read_text()
    # only the lost or drained index got a new pod: the healthy pods (and the spare) were never restarted
    assert _replaced_indexes(logs, pods) == {node}, sorted(f.name for f in logs.iterdir())
    if kind == "node":
        assert f"pod {pods}-{node}-local: exit code -9" in proc.stdout  # every process of it at once
    else:
        assert "drained: step" in (lost + "".join(p.read_text() for p in logs.glob("*.log")))
        assert f"pod {pods}-{node}-local: exit code 143" in proc.stdout  # left inside its grace period
        assert m.faults[0].lost_steps == 0
        assert m.faults[0].resume_step == FAULT_STEP  # saved and committed at the agreed step


def test_a_straggler_is_evicted_for_the_spare_with_no_lost_step(tmp_path: Path, fault_free: Path) -> None:
    """Rank 1 (pod 1) computes 3x slower from step 4; with STRAGGLER_POLICY=replace and a spare, every rank
    confirms it (reports every step here, so that 10 steps hold the warm-up), pod 1 drains itself at the
    agreed step and the spare finishes the job: no step lost, the fault-free model on disk."""
    run_id = "slow1"
    proc, run_dir = run_job(
        tmp_path, run_id, "SPARES=1", "STRAGGLER_POLICY=replace", "FAULT_SPEC=slow:step=4:rank=1:factor=3",
        "TRAIN.straggler.every=1", "TRAIN.straggler.warmup=3",
    )  # fmt: skip
    assert_same_model(run_dir, fault_free)
    m = metrics.load_run_metrics(run_dir)
    assert (m.steps_completed, m.lost_steps, m.faults) == (10, 0, [])  # a straggler fails nothing
    (s,) = m.stragglers
    assert (s.rank, s.node, s.evicted) == (1, 1, True) and s.step <= 6, s
    assert f"pod {run_id}-1-local: exit code 143" in proc.stdout  # drained inside its grace period
    assert "straggler: rank 1 on node 1" in proc.stdout
    # the report's attribution: which rank and node, and what share of the wall it cost
    (line,) = straggler_lines(m)
    assert line.startswith("straggler: rank 1 on node 1, ") and " % of wall " in line and "evicted" in line
    # confirmed in step 5's report; every rank learns of the drain in the next step's all-reduce and saves it
    events = metrics.load_events(run_dir)
    assert {int(e["step"]) for e in events if e["kind"] == "drained"} == {s.step + 1}
    assert {e["step"] for e in events if e["kind"] == "resume" and e.get("attempt") == 1} == {s.step + 1}
    # before draining the slow pod, its launcher tried to cordon the node: no Kubernetes API here; it says so
    (node,) = [e for e in events if e["kind"] == "straggler_node"]
    assert (node["target_rank"], node["pod"], node["evict"], node["cordoned"]) == (1, 1, True, False)
    assert node["node_name"] == socket.gethostname()  # spec.nodeName, as the local runner emulates it
    slow_log = (tmp_path / run_id / "logs" / f"{run_id}-1-local.log").read_text()
    assert "node not cordoned: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST)" in slow_log


@pytest.mark.parametrize("node", [0])  # pod 0, the one the study's baselines cannot lose; pod 1: with a spare
def test_node_loss_without_spares_waits_for_the_recreated_pod(
    tmp_path: Path, fault_free: Path, node: int
) -> None:
    run_id = f"nospare{node}"  # on the TrainJob: its JobSet's `node` Job recreates the pod
    pods = trainer_job_name("trainjob", run_id)
    proc, run_dir = run_job(
        tmp_path, run_id, "KIND=trainjob", f"FAULT_SPEC=node:step={FAULT_STEP}:node={node}"
    )
    assert f"pod {pods}-{node}-local: exit code -9" in proc.stdout
    assert f"pod {pods}-{node}-local-r1: exit code 0" in proc.stdout  # recreated, as the Job controller does
    assert _replaced_indexes(tmp_path / run_id / "logs", pods) == {node}
    assert_same_model(run_dir, fault_free)
    survivor = (tmp_path / run_id / "logs" / f"{pods}-{1 - node}-local.log").read_text()
    assert "the group re-forms: waiting up to 600 s" in survivor
    [fault] = metrics.load_run_metrics(run_dir).faults  # the buddy ring needs no spare
    assert (fault.takeover, fault.resume_source, fault.shared_bytes) == ("replacement", "peer", 0)


KILLS = 6
"""Rank kills on pod 1 in the run below, one every two steps."""


def test_rank_faults_keep_every_node_in_place_and_restore_from_memory(tmp_path: Path) -> None:
    """3 pods + 2 spares: six kills of pod 1's rank and an OOM of pod 2's each restart the group on the same
    nodes and restore every rank from its own node's memory; then pod 0's node is lost, fires as planned,
    and a spare takes its place with pod 0's state from its buddy. No restore reads the shared checkpoint
    folder, and the final checkpoint, loaded back from disk, equals a fault-free run's."""
    steps = 2 * KILLS + 10
    kills = [f"kill:step={2 * i + 5}:rank=1" for i in range(KILLS)]  # after step 2's save is committed
    faults = ",".join([*kills, f"oom:step={steps - 5}:rank=2", f"node:step={steps - 3}:node=0"])
    job = ["NODES=3", f"STEPS={steps}", "CHECKPOINT_MODE=async", "MONITOR_INTERVAL_S=0.1"]
    _, reference = run_job(tmp_path / "ref", "ref3", f"CHECKPOINT_INTERVAL={steps}", job=job)
    proc, run_dir = run_job(
        tmp_path / "run", "keep", "CHECKPOINT_INTERVAL=2", "SPARES=2", "NODE_FAILURE_LIMIT=0",
        "MAX_RESTARTS=20", f"FAULT_SPEC={faults}", job=job,
        flags=("--lost-pod-replace-after", "5"),  # the Job's new pod comes after a spare, as on EKS (40 s+)
    )  # fmt: skip
    assert_same_model(run_dir, reference)
    m = metrics.load_run_metrics(run_dir)
    assert not m.faults_unfired
    seen = [(f.kind, f.takeover, f.resume_source, f.shared_bytes) for f in m.faults]
    assert seen == [("kill", "same nodes", "memory", 0)] * KILLS + [
        ("oom", "same nodes", "memory", 0),
        ("node", "spare", "peer", 0),
    ], proc.stdout[-3000:]


def test_a_node_that_keeps_failing_is_given_up_and_the_spare_takes_over(
    tmp_path: Path, fault_free: Path
) -> None:
    """NODE_FAILURE_LIMIT=1: the first failure of the node's own (its worker SIGKILLed) gives it up. On the
    TrainJob: exit 75 spends one of the index's retries in its JobSet's `node` Job, which fails nothing."""
    run_id = "giveup"
    proc, run_dir = run_job(
        tmp_path, run_id, "KIND=trainjob", "SPARES=1", "NODE_FAILURE_LIMIT=1",
        f"FAULT_SPEC=kill:step={FAULT_STEP}:rank=1",
    )  # fmt: skip
    given_up = _launcher_events(run_dir, "node_given_up")
    assert len(given_up) == 1 and given_up[0]["failures"] == 1
    assert "signal SIGKILL" in given_up[0]["reason"]
    assert "exit code 75" in proc.stdout  # the given-up pod; the Job replaces it (a new spare)
    assert_same_model(run_dir, fault_free)


def test_drain_under_the_nvrx_wrapper_loses_no_step(tmp_path: Path, fault_free: Path) -> None:
    """The trainer inside NVRx's inprocess.Wrapper: SIGTERM to pod 1 still commits the step on every rank
    and the spare resumes from it (the Wrapper leaves SIGTERM to the trainer's drain handler). On the
    JobSet: the drained pod is replaced inside its `node` Job, the set goes on."""
    pytest.importorskip("nvidia_resiliency_ext", reason="NVRx is not installed")
    run_id = "drainnvrx"
    pods = trainer_job_name("jobset", run_id)
    proc, run_dir = run_job(
        tmp_path, run_id, "KIND=jobset", "SPARES=1", "INPROCESS=true", "INPROCESS_BACKEND=nvrx",
        f"FAULT_SPEC=drain:step={FAULT_STEP}:node=1",
    )  # fmt: skip
    assert_same_model(run_dir, fault_free)
    config = next((tmp_path / run_id / "configmaps").glob("*/train.yaml")).read_text()
    assert "backend: nvrx" in config  # the Wrapper ran, not the kit's own loop
    assert f"pod {pods}-1-local: exit code 143" in proc.stdout  # left inside its grace period
    assert _replaced_indexes(tmp_path / run_id / "logs", pods) == {1}
    m = metrics.load_run_metrics(run_dir)
    assert [(f.kind, f.lost_steps, f.resume_step, f.takeover) for f in m.faults] == [
        ("drain", 0, FAULT_STEP, "spare")
    ]


ELASTIC_JOB = [
    "NODES=4", "MIN_NODES=3", "ELASTIC_WAIT_S=2", "STEPS=12", "SEQ_LEN=64", "BATCH_SIZE=1", "LOG_EVERY=1",
    "TRAIN.training.global_batch=12", "TRAIN.optim.warmup_steps=3", "CHECKPOINT_INTERVAL=2",
    "CHECKPOINT_MODE=async", "MONITOR_INTERVAL_S=0.1",
]  # fmt: skip
"""The elastic tests' job (tests/elastic_job.py: the same model, data and global batch) on 4 pods that may
go on with 3."""


def test_a_node_lost_with_no_spare_shrinks_then_grows_back_with_the_same_global_batches(
    tmp_path: Path, elastic_reference: Path
) -> None:
    """4 pods, no spare; pod 2's node is lost at step 4 and its replacement comes 5 s later: the other 3 go
    on after ELASTIC_WAIT_S (resharded 4 -> 3 from the last checkpoint), the replacement is taken back at a
    step boundary (the 3 save first, as a drain) and the job finishes on 4 (resharded 3 -> 4). Every
    optimizer step consumed the fault-free 4-rank run's samples, each once, with its loss within fp32
    rounding; the report shows the world sizes and the node-hours at each."""
    from elastic_job import ELASTIC_LOSS_RTOL

    from fsdpkit.analysis.batch_ledger import compare_ledgers, step_batches

    run_id = "elastic"
    proc, run_dir = run_job(
        tmp_path, run_id, "FAULT_SPEC=node:step=4:node=2", job=ELASTIC_JOB,
        flags=("--lost-pod-replace-after", "5"),
    )  # fmt: skip
    ledger = compare_ledgers(step_batches(run_dir), step_batches(elastic_reference))
    assert ledger.exactly_once and ledger.same_batches and ledger.global_batch_kept, ledger.summary()
    assert ledger.worlds == [4, 3, 4], ledger.worlds
    assert ledger.max_loss_rel_diff <= ELASTIC_LOSS_RTOL, ledger.max_loss_rel_diff
    events = metrics.load_events(run_dir)
    tokens = {e["tokens"] for e in events if e["kind"] == "step" and e["rank"] == 0}
    assert tokens == {12 * 64}, "tokens per optimizer step, logged by every world size"
    resharded = {(e["from_world"], e["to_world"]) for e in events if e["kind"] == "resharded"}
    assert resharded == {(4, 3), (3, 4)}
    assert any(e["kind"] == "drained" for e in events), "the 3 saved the step the replacement joined at"
    assert f"pod {run_id}-2-local: exit code -9" in proc.stdout
    assert f"pod {run_id}-2-local-r1: exit code 0" in proc.stdout
    m = metrics.load_run_metrics(run_dir)
    assert [s.world_size for s in m.world_spans] == [4, 3, 4] and m.reshards == 2
    assert (m.faults[0].takeover, m.faults[0].resume_source) == ("none (shrank to 3 nodes)", "shared")
    assert world_line(m).startswith("4: ") and " -> 3: " in world_line(m)
    cost = fault_cost(m, usd_per_gpu_hour=1.0, price_source="test")
    assert set(cost.by_world) == {4, 3}
    assert cost.gpu_hours["total"] < 4 * m.wall_s / 3600, "the stretch on 3 is paid for 3 GPUs"
