"""Which state an in-process restart resumes from (fsdpkit.resilience.recovery.agree), whether a rank's
live state is clean (fsdpkit.resilience.state.TrainState brackets each step), and the test hook that fails a
rank mid-update.
The end-to-end runs (real processes, gloo) are in test_trainer_inprocess.py and test_fault_during_save.py.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fsdpkit.resilience.faults import FaultConfig, FaultConfigError, FaultInjector, InjectedFault
from fsdpkit.resilience.recovery import Plan, Report, agree
from fsdpkit.resilience.state import TrainState
from fsdpkit.runtime.events import EventLog, read_events
from fsdpkit.trainer.config import DataConfig
from fsdpkit.trainer.data import TokenLoader


def test_live_only_when_every_rank_is_clean_at_the_same_step() -> None:
    clean = [Report(live=6, why=None, memory=4, committed=4), Report(live=6, why=None, memory=4)]
    assert agree(clean, interval=4) == Plan("live", 6, None, resave=False)
    torn = [
        Report(live=6, why=None, memory=4),
        Report(live=None, why="failed mid-update of step 7", memory=4),
    ]
    assert agree(torn, interval=4) == Plan("memory", 4, "rank 1: failed mid-update of step 7")
    apart = [Report(live=6, why=None, memory=4), Report(live=7, why=None, memory=None)]
    assert agree(apart, interval=4) == Plan("checkpoint", None, "ranks stopped at different steps [6, 7]")


def test_a_live_resume_saves_again_when_the_last_due_save_never_committed() -> None:
    def plan(step: int, committed: int | None, interval: int | None) -> bool:
        reports = [Report(live=step, why=None, memory=None, committed=committed)] * 2
        return agree(reports, interval=interval).resave

    assert plan(6, committed=None, interval=2)  # nothing committed yet, step 6 was due
    assert plan(9, committed=4, interval=4)  # the save of 8 was abandoned
    assert not plan(9, committed=8, interval=4)
    assert not plan(3, committed=None, interval=4)  # no save due yet
    assert not plan(9, committed=None, interval=None)  # checkpoints off, or auto (counts from the resume)


def _state() -> TrainState:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TokenLoader(DataConfig(seq_len=8, batch_size=2), vocab_size=64, seed=3, rank=1, world_size=2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    return TrainState(model=model, optimizer=optimizer, scheduler=scheduler, data=data, rank=1)


def test_a_step_that_failed_before_its_update_is_rewound_to_its_start() -> None:
    state = _state()
    state.begin_step()
    first = state.data.next_batch()
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert state.live_step() == 0
    assert state.data.samples_consumed == 0
    again = state.data.next_batch()  # the resumed step fetches exactly the same batch
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(torch.rand(3), draws[0]) and (random.random(), np.random.rand()) == draws[1:]


def test_a_step_that_failed_mid_update_is_torn_and_a_finished_one_is_clean() -> None:
    state = _state()
    state.begin_step()
    state.data.next_batch()
    state.begin_update()
    assert state.live_step() is None
    state.step += 1
    state.end_step()
    assert state.live_step() == 1
    assert state.data.samples_consumed == 4, "a finished step is not rewound"


def test_the_in_update_hook_fires_once_after_the_update(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KIT_FAULT_TEST_IN_UPDATE", "exception:step=2:rank=1")
    events = EventLog(tmp_path, role="trainer", rank=1)
    injector = FaultInjector(
        FaultConfig(), rank=1, world_size=2, max_steps=5, events=events, run_dir=tmp_path
    )
    injector.maybe_inject(2)  # not at the top of the step
    with pytest.raises(InjectedFault, match="exception:step=2:rank=1"):
        injector.maybe_inject_in_update(2)
    injector.maybe_inject_in_update(2)  # replayed: no second fault
    faults = [e for e in read_events(tmp_path) if e["kind"] == "fault"]
    assert [(e["step"], e["where"]) for e in faults] == [(2, "update")]
    monkeypatch.setenv("KIT_FAULT_TEST_IN_UPDATE", "kill:step=2:rank=1")
    with pytest.raises(FaultConfigError, match="kill:step=2:rank=1 is not exception:step=N:rank=R"):
        FaultInjector(FaultConfig(), rank=1, world_size=2, max_steps=5, events=events)
