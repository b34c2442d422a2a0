"""A run that failed ends failed: the launcher that spends its restart budget closes the rendezvous with the
failure recorded (training/launcher/rendezvous/outcome.py), and a pod that comes after it (the Job's
replacement, a hot spare) exits RUN_FAILED in one line, never 0; after a finished run the same pods exit 0.
Real launchers against the kit's store process, on the kit's rendezvous and on the c10d adapter."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = """import os
if os.environ["KIT_TEST_OUTCOME"] == "fail":
    raise RuntimeError("the script fails in every attempt")
"""


@pytest.fixture
def store_port() -> Iterator[int]:
    """`python -m fsdpkit.launcher.store` on a free port (the Job's store pod: it outlives every launcher)."""
    port = free_port_run(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsdpkit.launcher.store", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and "serving" in proc.stdout.readline()
    yield port
    proc.kill()
    proc.wait()


def pod(
    tmp: Path, port: int, backend: str, outcome: str, name: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """One pod's launcher: node 0 of a 1-node job (or the spare, with `flags`), run to its exit."""
    script = tmp / "script.py"
    script.write_text(SCRIPT, encoding="utf-8")
    run = tmp / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp), KIT_TEST_OUTCOME=outcome)
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", "--nnodes=1", "--nproc-per-node=1",
         f"--rdzv-backend={backend}", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=job-{backend}",
         "--rdzv-conf=is_host=0,join_timeout=60", "--max-restarts=1", f"--run-dir={run}",
         f"--log-dir={tmp / 'logs' / name}", *flags, str(script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def launcher_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The launcher's last line: why it exits."""
    return [line for line in proc.stderr.splitlines() if line.startswith("kit-launch: ")][-1]


@pytest.mark.parametrize("backend", ["kit", "c10d"])
def test_after_a_failed_run_the_replacement_and_the_spare_fail_the_job(
    tmp_path: Path, store_port: int, backend: str
) -> None:
    first = pod(tmp_path, store_port, backend, "fail", "first")
    assert first.returncode == exitcodes.BUDGET_EXHAUSTED, first.stderr[-3000:]
    budget = launcher_line(first)
    assert budget.startswith("kit-launch: restart budget exhausted (--max-restarts=1); last failure: rank 0")
    replacement = pod(tmp_path, store_port, backend, "fail", "replacement")
    assert replacement.returncode == exitcodes.RUN_FAILED, replacement.stderr[-3000:]
    why = budget.removeprefix("kit-launch: ").removesuffix("; exiting 75")
    assert launcher_line(replacement) == (
        f"kit-launch: the run failed before this pod was needed: node 0 exited 75: {why}; exiting 69: the "
        "Job fails (a new pod cannot help)"
    )
    spare = pod(tmp_path, store_port, backend, "fail", "spare", "--spares=1", "--node-rank=1")
    assert spare.returncode == exitcodes.RUN_FAILED, spare.stderr[-3000:]
    assert "the run failed before this" in launcher_line(spare) and f"node 0 exited 75: {why}" in spare.stderr
    exits = [(e["code"], e["reason"]) for e in read_events(tmp_path / "run") if e["kind"] == "exit"]
    assert [code for code, _ in exits] == [75, 69, 69]  # what the run's events say, the exit statuses say
    assert all(why in reason for _, reason in exits)


@pytest.mark.parametrize("backend", ["kit", "c10d"])
def test_after_a_finished_run_the_replacement_and_the_spare_exit_0(
    tmp_path: Path, store_port: int, backend: str
) -> None:
    first = pod(tmp_path, store_port, backend, "finish", "first")
    assert first.returncode == exitcodes.OK, first.stderr[-3000:]
    replacement = pod(tmp_path, store_port, backend, "finish", "replacement")
    assert replacement.returncode == exitcodes.OK, replacement.stderr[-3000:]
    assert "the job finished before this pod was needed" in launcher_line(replacement)
    spare = pod(tmp_path, store_port, backend, "finish", "spare", "--spares=1", "--node-rank=1")
    assert spare.returncode == exitcodes.OK, spare.stderr[-3000:]
    assert "finished" in launcher_line(spare)
