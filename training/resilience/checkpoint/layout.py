"""Where checkpoints live in a run folder (design, contract 3): `<run_dir>/checkpoints/step_<N:08d>/`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fsdpkit.contracts.run_layout import CHECKPOINTS_DIR, COMMIT_FILE, STEP_DIR, step_dir_name


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir(root: Path, step: int) -> Path:
    return root / step_dir_name(step)


def remove_step(root: Path, step: int) -> None:
    """Delete a step folder, commit record first, so a half-deleted step never counts as committed."""
    folder = step_dir(root, step)
    (folder / COMMIT_FILE).unlink(missing_ok=True)
    shutil.rmtree(folder)


def list_steps(root: Path) -> list[int]:
    """Every step folder present, committed or not, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for entry in os.scandir(root):
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def is_committed(root: Path, step: int) -> bool:
    """A step exists for resume only once its commit record is in place (written last)."""
    return (step_dir(root, step) / COMMIT_FILE).is_file()


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (new or renamed files) durable, as a rename alone is not."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
