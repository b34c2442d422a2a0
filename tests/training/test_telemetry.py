"""Live metrics (fsdpkit.runtime.telemetry): the settings' one-line errors, records that the EMF
specification's rules accept, the agent sink over a real socket, and what the trainer's and launcher's events
turn into."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_settings import MetricsSettings, MetricsSettingsError
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.telemetry.emf import EmfPublisher, format_record
from fsdpkit.runtime.telemetry.launcher import LauncherMetrics
from fsdpkit.runtime.telemetry.trainer import TrainerMetrics
from fsdpkit.trainer import train
from tests.fixtures.emf_spec import EmfViolation, parse_event

REPO = Path(__file__).resolve().parents[2]
SETTINGS = MetricsSettings(cluster="c1", job="run-1", sink="file")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KIT_METRICS": "cloudwatch"},
            "KIT_METRICS='cloudwatch' is not a metrics sink; use off, file or agent",
        ),
        ({"KIT_METRICS": ""}, "KIT_METRICS='' is not a metrics sink"),
        ({"AWS_EMF_AGENT_ENDPOINT": "http://agent:25888"}, "AWS_EMF_AGENT_ENDPOINT='http://agent:25888'"),
        ({"AWS_EMF_AGENT_ENDPOINT": "tcp://agent"}, "is not an agent endpoint; use tcp://HOST:PORT"),
        ({"AWS_EMF_AGENT_ENDPOINT": "tcp://agent:99999"}, "is not an agent endpoint"),
        (
            {"KIT_METRICS_PERIOD_S": "nan"},
            "KIT_METRICS_PERIOD_S='nan' is not a period; use seconds from 1 to 300",
        ),
        ({"KIT_METRICS_PERIOD_S": "inf"}, "KIT_METRICS_PERIOD_S='inf'"),
        ({"KIT_METRICS_PERIOD_S": "-5"}, "KIT_METRICS_PERIOD_S='-5'"),
        ({"KIT_METRICS_PERIOD_S": "1e9"}, "KIT_METRICS_PERIOD_S='1e9'"),
        ({"KIT_CLUSTER_NAME": "my cluster"}, "KIT_CLUSTER_NAME='my cluster' is not a dimension value"),
        ({"KIT_JOB_NAME": "j\u00f6b"}, "KIT_JOB_NAME='j\u00f6b' is not a dimension value"),
        ({"KIT_METRICS_LOG_GROUP": "a group"}, "KIT_METRICS_LOG_GROUP='a group' is not a log group name"),
    ],
)
def test_bad_settings_say_which_variable_in_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(MetricsSettingsError) as info:
        MetricsSettings.from_env(env, run_id="run-1")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_defaults_and_the_run_id_as_job_name() -> None:
    s = MetricsSettings.from_env({}, run_id="run-1")
    assert (s.sink, s.cluster, s.job, s.period_s) == ("file", "local", "run-1", 30.0)
    assert s.host_port == ("tcp", "cloudwatch-agent.amazon-cloudwatch", 25888)
    assert s.log_group == "/kit/local/training-metrics"


def test_trainer_and_launcher_refuse_bad_metrics_settings_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("KIT_METRICS", "yes")
    code = train.main(["--run.id", "bad", "--run.root", str(tmp_path), "--training.steps", "4"])
    assert code == exitcodes.FATAL_CONFIG
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "KIT_METRICS='yes' is not a metrics sink" in err[0]
    assert not dist.is_initialized() and not any(tmp_path.iterdir())
    monkeypatch.delenv("KIT_METRICS")
    env = {**os.environ, "PYTHONPATH": str(REPO), "KIT_METRICS_PERIOD_S": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", "--standalone", "-m", "fsdpkit.trainer"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == exitcodes.USAGE and "Traceback" not in proc.stderr
    assert "KIT_METRICS_PERIOD_S='0' is not a period" in proc.stderr.strip().splitlines()[-1]


def test_every_catalog_metric_formats_to_records_the_specification_accepts() -> None:
    values = {spec.name: float(i) for i, spec in enumerate(catalog.METRICS)}
    values[catalog.STEP_TIME.name] = float("nan")  # left out, never written as NaN
    lines = format_record(SETTINGS, values, ts=1_800_000_000.0, properties={"pod": "p-0", "node_rank": 0})
    data = [d for line in lines for d in parse_event(line)]
    names = {d.name for d in data}
    assert names == {spec.name for spec in catalog.METRICS} - {catalog.STEP_TIME.name}
    for d in data:
        assert d.namespace == catalog.NAMESPACE and d.timestamp_ms == 1_800_000_000_000
        assert d.unit == catalog.BY_NAME[d.name].unit
        assert d.dimensions in ((("ClusterName", "c1"), ("JobName", "run-1")), (("ClusterName", "c1"),))
        assert d.value == values[d.name]
    faults = [d for line in format_record(SETTINGS, {"Faults": 1.0}, ts=1.0, fault_class="hard") for d in
              parse_event(line)]  # fmt: skip
    assert {d.dimensions for d in faults} == {
        (("ClusterName", "c1"), ("JobName", "run-1"), ("FaultClass", "hard")),
        (("ClusterName", "c1"), ("FaultClass", "hard")),
    }
    with pytest.raises(KeyError):
        format_record(SETTINGS, {"Stepp": 1.0}, ts=1.0)
    with pytest.raises(EmfViolation):  # the reader is strict: a record whose metric has no value fails
        parse_event(json.dumps({**json.loads(lines[0]), catalog.STEP.name: None}))


class _Agent:
    """A stand-in for the CloudWatch agent's EMF listener: a real TCP server that keeps the lines it got."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lines: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("r", encoding="utf-8") as stream:
            self.lines.extend(line.rstrip("\n") for line in stream)


def test_the_agent_sink_sends_each_record_as_one_line_with_its_log_group() -> None:
    agent = _Agent()
    settings = MetricsSettings(sink="agent", endpoint=f"tcp://127.0.0.1:{agent.port}", cluster="c1", job="j",
                               log_group="/kit/c1/training-metrics", period_s=300.0)  # fmt: skip
    publisher = EmfPublisher(
        settings, run_dir=None, who="t", properties={}, gauges=lambda: {"WorldSize": 8.0}
    )
    for step in range(1, 6):
        publisher.put({"Step": float(step), "StepTime": 0.5})
    publisher.close()
    deadline = time.monotonic() + 10
    while len(agent.lines) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    records = [json.loads(line) for line in agent.lines]
    assert [r.get("Step") for r in records[:5]] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert records[5]["WorldSize"] == 8.0  # the last gauge record, published at close
    assert all(r["_aws"]["LogGroupName"] == "/kit/c1/training-metrics" for r in records)
    assert all(parse_event(line) for line in agent.lines)


def test_an_agent_nobody_listens_on_drops_records_says_so_once_and_never_raises(capsys) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    settings = MetricsSettings(sink="agent", endpoint=f"tcp://127.0.0.1:{port}", cluster="c", job="j")
    publisher = EmfPublisher(settings, run_dir=None, who="t", properties={})
    for step in range(50):
        publisher.put({"Step": float(step)})
    publisher.close()
    assert publisher._agent is not None and publisher._agent.dropped == 50
    err = [line for line in capsys.readouterr().err.splitlines() if "cannot be reached" in line]
    assert len(err) == 1 and f"tcp://127.0.0.1:{port}" in err[0]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((run_dir / "metrics").glob("*.emf.jsonl"))
            for line in path.read_text().splitlines()]  # fmt: skip


def test_trainer_metrics_from_rank_0s_events(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    events = EventLog(run_dir, role="trainer", rank=0)
    metrics = TrainerMetrics.start(SETTINGS, events, run_dir=run_dir, interval_steps=4, checkpoints=True)
    assert metrics is not None
    events.emit("start", world_size=4)
    for step in range(1, 5):
        events.emit("step", step=step, loss=1.0, duration_s=0.5, tokens_per_s=100.0, mfu=0.4)
    events.emit("ckpt", step=4, phase="stall", duration_s=0.02)
    now = time.time()
    events.emit("ckpt", step=4, phase="commit", duration_s=3.0, ts=now)
    gauges = metrics.gauges()
    assert gauges["WorldSize"] == 4.0
    assert (
        3.0 <= gauges["CheckpointAge"] < 3.0 + (time.time() - now) + 1.0
    )  # from the saved step, not the commit
    assert gauges["CheckpointAgeIntervals"] == pytest.approx(gauges["CheckpointAge"] / (4 * 0.5), rel=0.05)
    assert 0.0 < gauges["Goodput"] <= 100.0
    t_fail = time.time()
    events.emit("resume", step=4, source="live", duration_s=0.01, fallback_from=None)
    events.emit(
        "inprocess_restart", reason="x", restored_step=4, source="live", duration_s=0.5, ts=t_fail + 0.5
    )
    assert metrics.gauges()["CheckpointAge"] < 1.0  # restored: nothing at risk
    events.emit("step", step=5, loss=1.0, duration_s=0.5, ts=t_fail + 1.5)
    events.emit("interval", interval=8, previous=4, reason="measured", step=5)
    events.emit("drained", step=5, duration_s=0.1, signalled=True)
    metrics.close()
    events.close()
    records = _records(run_dir)
    by_metric = {name: [r[name] for r in records if name in r] for name in catalog.BY_NAME}
    assert by_metric["Step"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert by_metric["MFU"] == [40.0] * 4 and by_metric["TokensPerSecond"] == [100.0] * 4
    assert by_metric["CheckpointStall"] == [0.02]
    assert by_metric["InprocessRestarts"] == [1.0]
    assert by_metric["RecoverySeconds"] == [pytest.approx(1.5)]  # restart start to the first step's end
    assert [r["FaultClass"] for r in records if "Faults" in r] == ["drain"]
    assert by_metric["CheckpointAgeIntervals"][-1] == pytest.approx(
        by_metric["CheckpointAge"][-1] / 4, rel=0.05
    )


def test_launcher_metrics_count_faults_once_and_a_waiting_spare_is_not_a_stuck_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    events = EventLog(run_dir, role="launcher", rank=None)
    metrics = LauncherMetrics.start(
        SETTINGS, events, run_dir=str(run_dir), node_rank=2, max_restarts=5, spares=1
    )
    assert metrics is not None
    events.emit("spare_waiting", node_rank=2)
    waiting = metrics.gauges()
    assert waiting["SparesWaiting"] == 1.0 and "SecondsSinceStep" not in waiting
    events.emit("group_started", attempt=0, ranks=[4, 5])
    metrics.last_step_ts = lambda: time.time() - 42.0
    training = metrics.gauges()
    assert training["SparesWaiting"] == 0.0 and training["SecondsSinceStep"] == pytest.approx(42.0, abs=1.0)
    for rank, first in ((4, True), (5, False)):  # a killed rank and the peer that died after it: one fault
        events.emit(
            "worker_failed", local_rank=rank - 4, global_rank=rank, exitcode=-9, reason="", first=first
        )
    events.emit("restart", attempt=1, reason="x", remaining=4)
    events.emit("hang_detected", global_rank=5, stale_s=2.0, timeout_s=1.0, action="restart")
    events.emit("node_given_up", node=2, failures=3, window_s=600, reason="x")
    metrics.close()
    events.close()
    records = _records(run_dir)
    assert [r["FaultClass"] for r in records if "Faults" in r] == ["hard", "silent", "bad_node"]
    assert [(r["Restarts"], r["RestartsLeft"]) for r in records if "Restarts" in r] == [(1.0, 4.0)]
    assert records[-1]["RestartsLeft"] == 4.0 and records[-1]["node_rank"] == 2


def test_sink_off_publishes_nothing(tmp_path: Path) -> None:
    events = EventLog(tmp_path, role="trainer", rank=0)
    off = MetricsSettings(sink="off")
    assert TrainerMetrics.start(off, events, run_dir=tmp_path, interval_steps=4, checkpoints=True) is None
    events.emit("step", step=1, loss=1.0, duration_s=0.5)
    events.close()
    assert not (tmp_path / "metrics").exists()


def test_docs_list_every_metric_and_alarm_as_the_catalog_has_them() -> None:
    assert catalog.metrics_markdown() in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    runbook = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    assert catalog.alarms_markdown(catalog.AlarmThresholds()) in runbook


def test_the_preview_draws_the_dashboard_from_a_runs_records(tmp_path: Path, capsys) -> None:
    from fsdpkit.analysis import dashboard_preview as preview

    run_dir = tmp_path / "run"
    publisher = EmfPublisher(SETTINGS, run_dir=run_dir, who="t", properties={})
    for step in range(1, 4):
        publisher.put({"Step": float(step), "Goodput": 95.0, "RestartsLeft": 2.0})
    publisher.put({"Faults": 1.0}, fault_class="hard")
    publisher.close()
    series = preview.read_series(run_dir)
    assert [v for _, v, _ in series["Step"]] == [1.0, 2.0, 3.0] and series["Faults"][0][2] == "hard"
    rules = {r.key: r for r in catalog.alarm_rules(catalog.AlarmThresholds())}
    assert preview.breached(series, rules["RestartBudget"]) is True  # 2 left <= 2
    assert preview.breached(series, rules["LowGoodput"]) is False
    assert preview.breached(series, rules["NoProgress"]) is None  # no launcher in this run
    assert preview.main([str(run_dir)]) == exitcodes.OK
    assert (run_dir / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert preview.main([str(tmp_path)]) == exitcodes.USAGE  # no metrics/ there
    assert preview.main([str(run_dir), "--png", str(tmp_path)]) == exitcodes.USAGE  # a folder
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 2 and "has no metrics/ folder" in err[0] and "is a folder; give a file path" in err[1]
