"""Check the rendered trainer config with the trainer's own rules before anything is applied.

k8s does not import the trainer (no torch here, design's folders table): it runs
`python -m fsdpkit.trainer.check_config --elsewhere --config <file>` as a subprocess on exactly the
`train.yaml` the ConfigMap will hold, and turns the trainer's one-line error (exit 78) into a `ValuesError`.
The trainer's config module does not import torch (training/resilience/checkpoint/__init__.py), so a check
takes ~0.2 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fsdpkit.k8s.model import ValuesError

REPO_ROOT = Path(__file__).resolve().parent.parent
FATAL_CONFIG = 78
"""training/contracts/exitcodes.FATAL_CONFIG: the trainer refused the config."""
CHECK_TIMEOUT_S = 120.0
"""A config check that takes longer is stuck (it normally takes seconds); it fails the render."""


def check_trainer_config(
    config_yaml: str,
    *,
    memory: tuple[int, int, int, int] | None = None,
    plan: bool = True,
    python: str = sys.executable,
) -> str | None:
    """Raise ValuesError with the trainer's message if it would refuse `config_yaml`; with `memory`
    (world size, ranks per node, GPU MiB (0: CPU), pod memory MiB) check it in that job's world and, unless
    `plan` is False, also check the trainer's memory plan for that job and return the plan's line.

    With ENTRYPOINT the config holds only the resilience sections: the same loader checks them (the kit
    trainer's own sections keep their defaults, which pass), and `plan=False` leaves out the memory plan,
    which is about the kit trainer's model, not the script's."""
    extra = ["--memory", ",".join(map(str, memory))] if memory and plan else []
    with tempfile.TemporaryDirectory(prefix="kit-check-") as tmp:
        path = Path(tmp) / "train.yaml"
        path.write_text(config_yaml, encoding="utf-8")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
        }
        if memory:  # the pod's world: the trainer checks fault ranks and the like against it
            env |= {"WORLD_SIZE": str(memory[0]), "LOCAL_WORLD_SIZE": str(memory[1])}
        try:
            proc = subprocess.run(
                [python, "-m", "fsdpkit.trainer.check_config", "--elsewhere", "--config", str(path), *extra],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp,
                timeout=CHECK_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ValuesError(
                f"the trainer's config check did not finish in {CHECK_TIMEOUT_S:g} s; "
                f"run {python} -m fsdpkit.trainer.check_config --config FILE to see why"
            ) from None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode == 0:
        plan = [line for line in proc.stdout.splitlines() if line.startswith("memory plan:")]
        return plan[-1] if plan else None
    last = lines[-1].strip() if lines else "(no output)"
    if proc.returncode == FATAL_CONFIG:
        raise ValuesError(f"the trainer refuses this config: {last.removeprefix('error: ')}")
    raise ValuesError(
        f"the trainer's config check could not run (exit {proc.returncode}: {last}); "
        "install the trainer's requirements here (make setup)"
    )
