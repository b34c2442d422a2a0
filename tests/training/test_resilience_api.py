"""The public resilience API (fsdpkit.resilience): its surface, its layering, its config, the step protocol
and the report of planned faults that never fired. The end-to-end proofs (a user's script under the
launcher and the local runner with faults, bitwise equal on disk) are in tests/k8s/test_k8s_own_model.py."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import pytest
import torch

from fsdpkit import resilience
from fsdpkit.analysis.metrics import load_run_metrics
from fsdpkit.analysis.report import metrics_table
from fsdpkit.resilience.faults import FaultConfig, FaultInjector
from fsdpkit.runtime.events import EventLog, read_events

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _sigterm_restored():
    """A Job installs the drain's SIGTERM handler for the process's life: not for this pytest worker's."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_the_public_surface_is_small_and_every_name_resolves() -> None:
    """14 names (API 2.2: 2.1's twelve, ParallelConfig and MeshLayout); a name added bumps the minor version,
    one removed the major (docs/own-model.md)."""
    assert len(resilience.__all__) == 14
    for name in resilience.__all__:
        assert getattr(resilience, name) is not None
    assert resilience.API_VERSION == "2.2"
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        resilience.Trainer  # noqa: B018


def test_reading_the_config_imports_no_torch() -> None:
    code = "import sys; from fsdpkit import resilience; resilience.load_config(['--run.id', 'x']); "
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_config_reads_the_jobs_file_then_the_scripts_leftover_options(tmp_path: Path) -> None:
    job_file = tmp_path / "kit.yaml"
    job_file.write_text(
        "run: {id: from-file, root: /fsx/runs}\ncheckpoint: {interval: 7}\n", encoding="utf-8"
    )
    env = {"KIT_CONFIG": str(job_file)}
    cfg = resilience.load_config(["--checkpoint.interval", "9"], env=env)
    assert (cfg.run.id, cfg.run.root, cfg.checkpoint.interval) == ("from-file", "/fsx/runs", 9)
    job_file.write_text("run: {id: x}\nmodel: {name: tiny}\n", encoding="utf-8")
    with pytest.raises(resilience.ConfigError, match="unknown config section 'model'; valid sections: run, "):
        resilience.load_config([], env=env)
    with pytest.raises(resilience.ConfigError, match=r"run\.id is required"):
        resilience.load_config([], env={})
    with pytest.raises(resilience.ConfigError, match="targets rank 3 but the world size is 2"):
        resilience.load_config(
            ["--run.id", "x", "--fault.spec", "kill:step=2:rank=3"], env={"WORLD_SIZE": "2"}
        )
    with pytest.raises(resilience.ConfigError, match="unknown option --lr"):
        resilience.load_config(["--run.id", "x", "--lr", "3"], env={})


@dataclasses.dataclass(frozen=True, kw_only=True)
class _OptimSection:
    lr: float = 3e-4
    """Peak learning rate."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """How the rate falls after warmup."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise resilience.ConfigError(f"optim.lr must be > 0, got {self.lr}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ScriptConfig(resilience.ResilienceConfig):
    optim: _OptimSection = dataclasses.field(default_factory=_OptimSection)

    def validate(self, *, env: Mapping[str, str]) -> None:
        super().validate(env=env)
        if self.optim.schedule == "constant" and self.training.steps > 1000:
            raise resilience.ConfigError("optim.schedule=constant over 1000 steps: use cosine")


def test_a_script_adds_a_typed_section_read_overridden_checked_and_documented_like_the_kits(
    tmp_path: Path,
) -> None:
    job_file = tmp_path / "kit.yaml"
    job_file.write_text("run: {id: mine}\noptim: {lr: 0.01, schedule: constant}\n", encoding="utf-8")
    env = {"KIT_CONFIG": str(job_file)}
    cfg = resilience.load_config(["--optim.lr=0.02"], env=env, root=_ScriptConfig)
    assert isinstance(cfg, _ScriptConfig)
    assert (cfg.run.id, cfg.optim.lr, cfg.optim.schedule) == ("mine", 0.02, "constant")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.lr = 1.0  # type: ignore[misc]
    for argv, message in (
        (["--optim.lrr", "1"], "unknown config key optim.lrr; valid keys in 'optim': optim.lr, optim.sch"),
        (["--optim.schedule", "step"], "optim.schedule must be one of cosine, constant; got 'step'"),
        (["--optim.lr", "-1"], "optim.lr must be > 0, got -1.0"),
        (["--optim.lr", "nan"], "optim.lr"),
        (["--training.steps", "2000"], "optim.schedule=constant over 1000 steps: use cosine"),
    ):
        with pytest.raises(resilience.ConfigError) as info:
            resilience.load_config(argv, env=env, root=_ScriptConfig)
        assert message in str(info.value) and "\n" not in str(info.value), argv
    assert "optim.lr" in _ScriptConfig.valid_keys() and "run.id" in _ScriptConfig.valid_keys()
    assert "  --optim.schedule (cosine | constant, default 'cosine')" in _ScriptConfig.help_text("usage: x")
    with pytest.raises(TypeError, match="ResilienceConfig or a dataclass subclass"):
        resilience.load_config([], env=env, root=dict)  # type: ignore[arg-type]


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.n = state["n"]


def _session(tmp_path: Path) -> tuple[resilience.Job, resilience.Session, _Counter]:
    from fsdpkit.runtime.distributed import DistContext

    cfg = resilience.load_config(["--run.id", "api", "--run.root", str(tmp_path), "--checkpoint.mode", "off"])
    job = resilience.Job(cfg)
    job.ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
                          timeout=__import__("datetime").timedelta(seconds=5))  # fmt: skip
    model = torch.nn.Linear(2, 1)
    counter = _Counter()
    state = resilience.TrainState(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=counter, rank=0,
        extras={"counter": _Counter()},
    )  # fmt: skip
    return job, resilience.Session(job, state), counter


def test_a_step_without_its_update_is_refused_and_a_full_one_is_counted(tmp_path: Path) -> None:
    job, session, data = _session(tmp_path)
    missing = r"step 1: the block ended without `with step.update\(\):`"
    with pytest.raises(RuntimeError, match=missing), job.step(session):
        data.n += 1
    assert session.step == 0
    with job.step(session) as step:
        with step.update():
            session.optimizer.step()
        assert step.report(torch.tensor(2.5)) == 2.5
        with pytest.raises(RuntimeError, match=r"step 1: step.report\(\) called twice"):
            step.report(1.0)
    assert session.step == 1 and step.number == 1 and step.loss == 2.5
    steps = [e for e in read_events(job.cfg.run.run_dir) if e["kind"] == "step"]
    assert [(e["step"], e["loss"]) for e in steps] == [(1, 2.5)]
    job.close()


def test_a_failed_step_rewinds_the_data_loader_not_the_extras(tmp_path: Path) -> None:
    job, session, data = _session(tmp_path)
    extra = session.state.extras["counter"]
    session.state.begin_step()
    data.n, extra.n = 5, 7
    assert session.state.live_step() == 0  # failed before its update: the batch is fetched again
    assert (data.n, extra.n) == (0, 7)  # extras change in the update: nothing to rewind, nothing copied
    assert set(session.state.state_dict()) >= {"data", "extra.counter.rank0", "rng.rank0", "step", "model"}
    per_rank = resilience.TrainState(model=session.model, optimizer=session.optimizer, data=data, rank=0,
                                     data_per_rank=True)  # fmt: skip
    saved = per_rank.state_dict()
    assert "data.rank0" in saved and "data" not in saved
    data.n = 3
    per_rank.load_state_dict(saved)
    assert data.n == 0
    job.close()


def test_a_planned_fault_that_never_fired_is_in_the_events_and_the_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "unfired"
    events = EventLog(run_dir, role="trainer", rank=0)
    cfg = FaultConfig(spec="exception:step=2:rank=0,kill:step=9:rank=1")
    injector = FaultInjector(cfg, rank=0, world_size=2, max_steps=10, events=events, run_dir=run_dir)
    with pytest.raises(resilience.InjectedFault):
        injector.maybe_inject(2)
    assert [str(f) for f in injector.unfired()] == ["kill:step=9:rank=1"]  # every rank's plan, by marker
    for kind, fields in (
        ("start", {"world_size": 2}),
        ("step", {"step": 1, "duration_s": 0.1, "t_start": 1.0}),
        ("fault_unfired", {"fault": "kill:step=9:rank=1", "step": 1}),
        ("end", {"step": 1}),
    ):
        events.emit(kind, **fields)  # fmt: skip
    events.close()
    m = load_run_metrics(run_dir)
    assert m.faults_unfired == ["kill:step=9:rank=1"]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(metrics_table(m))
    assert "(1 planned never fired)" in console.export_text()


def test_a_state_reshards_only_with_a_declared_global_data_position_and_no_per_rank_extras() -> None:
    """A position that is the same on every rank may still count per-rank batches (a DistributedSampler's):
    only a script that says it counts global samples (`data_global`) resumes on another world size."""
    model = torch.nn.Linear(2, 2)
    common = {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "rank": 0}
    assert resilience.TrainState(**common).reshard_problem() is None  # no loader state at all
    assert resilience.TrainState(**common, data=_Counter(), data_global=True).reshard_problem() is None
    assert resilience.TrainState(**common, data=_Counter()).reshard_problem() == (
        "the data position is not declared global (TrainState data_global=True)"
    )
    per_rank = resilience.TrainState(**common, data=_Counter(), data_per_rank=True)
    assert per_rank.reshard_problem() == "the data position is per rank (TrainState data_per_rank=True)"
    ema = resilience.TrainState(**common, data=_Counter(), data_global=True, extras={"ema": _Counter()})
    assert ema.reshard_problem() == "per-rank extras ema"
    with pytest.raises(ValueError, match="data_per_rank and data_global exclude each other"):
        resilience.TrainState(**common, data=_Counter(), data_per_rank=True, data_global=True)
