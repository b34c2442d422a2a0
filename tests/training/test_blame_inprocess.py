"""The hang's blame under the real trainer: torchelastic's `@record` wraps the trainer's `main`, so every
rank's stack has a torch.distributed frame at its outer end; only the innermost frames say whether a
rank waits in a collective (judged by the outer frames, `make demo`'s kit run would blame rank 0 for rank
1's hang). The blame under the real trainer and launcher: tests/training/test_launch_trainer.py's study
schedule."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

from trainer_helpers import REPO, trainer_env

from fsdpkit.launcher import blame
from fsdpkit.runtime import stacks as stacks_module

HANGING_WORKER = textwrap.dedent(
    """
    import sys, time
    from torch.distributed.elastic.multiprocessing.errors import record
    from fsdpkit.runtime import stacks

    def stuck():
        print("ready", flush=True)
        while True:
            time.sleep(3600)

    @record
    def main():
        stacks.install()
        stuck()

    main()
    """
)


def test_a_rank_asleep_under_record_is_elsewhere_not_in_a_collective(tmp_path: Path) -> None:
    script = tmp_path / "hanging_worker.py"
    script.write_text(HANGING_WORKER)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    env = trainer_env(tmp_path) | {stacks_module.STACKS_DIR_ENV: str(stacks), "RANK": "3"}
    with subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            found = blame.probe(stacks, 3, proc.pid, timeout_s=10)
        finally:
            proc.kill()
    assert found.state == "elsewhere", found
    assert found.where.startswith(f"{script.name}:") and found.where.endswith(" in stuck"), found
    dump = stacks_module.stack_path(stacks, 3, proc.pid).read_text()
    assert f"{blame.COLLECTIVE_PATH}elastic" in dump  # the @record frame is there, and is not the verdict


def test_innermost_frames_decide_whether_a_rank_waits_in_a_collective() -> None:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    torch_dir = spec.submodule_search_locations[0]
    c10d = f"{torch_dir}/distributed/distributed_c10d.py"
    ops = f"{torch_dir}/_ops.py"
    mine = str(REPO / "training/trainer/train.py")
    record = f"{torch_dir}/distributed/elastic/multiprocessing/errors/__init__.py"
    assert blame.waits_in_collective([c10d, mine, record])
    assert blame.waits_in_collective([ops, f"{torch_dir}/distributed/_functional_collectives.py", mine])
    assert not blame.waits_in_collective([str(REPO / "training/resilience/faults.py"), mine, record])
    assert not blame.waits_in_collective([f"{torch_dir}/nn/functional.py", mine, record])


def test_culprit_is_the_stalest_heartbeat_among_ranks_that_share_the_deciding_state() -> None:
    waiting, elsewhere, stopped = (
        blame.Probe(rank=0, state="collective"),
        blame.Probe(rank=1, state="elsewhere"),
        blame.Probe(rank=2, state="stopped"),
    )
    assert blame.culprit([waiting, elsewhere], default=0) == 1
    assert blame.culprit([waiting, elsewhere, stopped], default=1) == 2
    also_elsewhere = blame.Probe(rank=3, state="elsewhere")
    assert blame.culprit([waiting, elsewhere, also_elsewhere], default=3) == 3
    assert blame.culprit([waiting, elsewhere, also_elsewhere], default=0) == 1
    assert blame.culprit([waiting], default=5) == 5
