"""Bad input to every training entry point: one line that names the value and says what to do, a non-zero
exit, no traceback, nothing started (no process group, no worker, no output file). The table in
docs/launcher.md ("Bad input") lists the same inputs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from fsdpkit.analysis import report
from fsdpkit.contracts import exitcodes
from fsdpkit.data import make_shards
from fsdpkit.trainer import train

REPO = Path(__file__).resolve().parents[2]
BASE = ["--run.id", "bad", "--model.name", "tiny", "--training.steps", "16"]


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # @record under pytest's capture
@pytest.mark.parametrize(
    ("args", "world", "message"),
    [
        (["--optim.lr", "inf"], 1, "optim.lr='inf': must be a finite number"),
        (["--optim.lr", "nan"], 1, "optim.lr='nan': must be a finite number"),  # not blamed on min_lr
        (["--optim.grad_clip", "nan"], 1, "optim.grad_clip='nan': must be a finite number"),
        (
            ["--training.collective_timeout_s", "nan"],
            1,
            "training.collective_timeout_s='nan': must be a finite",
        ),
        (
            ["--training.collective_timeout_s", "1e300"],
            1,
            "training.collective_timeout_s='1e300': must be at most",
        ),
        (["--inprocess.barrier_timeout_s", "inf"], 1, "inprocess.barrier_timeout_s='inf': must be a finite"),
        (["--checkpoint.pg_timeout_s", "-inf"], 1, "checkpoint.pg_timeout_s='-inf': must be a finite number"),
        (["--optim.lr", "fast"], 1, "optim.lr='fast': not a number; pass a number"),
        (["--checkpoint.interval", "soon"], 1, "checkpoint.interval must be int | auto, got 'soon'"),
        (["--checkpoint.mtbf_s", "nan"], 1, "checkpoint.mtbf_s='nan': must be a finite number"),
        (
            ["--checkpoint.interval=auto", "--checkpoint.interval_min=50", "--checkpoint.interval_max=5"],
            1,
            "checkpoint.interval_min (50) must be <= checkpoint.interval_max (5): raise interval_max",
        ),
        (
            ["--fault.spec", "kill:step=1:rank=5"],
            2,
            "targets rank 5 but the world size is 2; use a rank below 2",
        ),
        (["--fault.spec", "kill:step=50:rank=0"], 2, "after the last step (16) and would never fire"),
        (
            ["--fault.schedule_seed", "7"],
            1,
            "the seeded fault schedule never targets rank 0, so it needs a world",
        ),
    ],
)
def test_trainer_refuses_bad_config_before_any_process_group(
    args: list[str], world: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    code = train.main([*BASE, "--run.root", str(tmp_path), *args])
    assert code == exitcodes.FATAL_CONFIG
    assert message in _one_line(capsys.readouterr().err)
    assert not dist.is_initialized() and not any(tmp_path.iterdir())


def test_a_bad_fault_plan_fails_the_launcher_at_once_with_78(tmp_path: Path) -> None:
    """Checked before the group, so the launcher never retries it (a retry would fail the same way, until
    the budget was spent)."""
    proc = _launch(
        tmp_path,
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "-m", "fsdpkit.trainer", *BASE,
         "--run.root", str(tmp_path / "runs"), "--fault.spec", "kill:step=1:rank=5"],
    )  # fmt: skip
    assert proc.returncode == exitcodes.FATAL_CONFIG, proc.stderr[-3000:]
    assert "targets rank 5 but the world size is 2" in proc.stderr
    assert "restart 1:" not in proc.stderr and "Traceback" not in proc.stderr


def _launch(tmp: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), **env}
    full_env.pop("KIT_HEARTBEAT_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", *argv],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launcher_refuses_a_module_that_does_not_exist(tmp_path: Path) -> None:
    proc = _launch(tmp_path, ["--standalone", "-m", "training.trian", "--run.id", "x"])
    assert proc.returncode == exitcodes.FATAL_CONFIG  # the same on every restart and pod: fail the Job
    line = _one_line(proc.stderr)
    assert "-m training.trian: no such module on the Python path" in line and "check its spelling" in line


def test_launcher_refuses_a_tmpdir_too_long_for_the_zygote_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    proc = _launch(tmp_path, ["--standalone", "-m", "fsdpkit.trainer"], TMPDIR=str(deep))
    assert proc.returncode == exitcodes.FATAL_CONFIG
    line = _one_line(proc.stderr)
    assert f"TMPDIR={str(deep)!r} is too long" in line and "--worker-start exec" in line
    assert not list(deep.iterdir())  # its temp folder is removed again


def test_launcher_refuses_a_rendezvous_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = _launch(
            tmp_path,
            ["--nnodes", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "x", "--rdzv-conf",
             "is_host=1", "--worker-start", "exec", "-m", "fsdpkit.trainer"],
        )  # fmt: skip
    assert proc.returncode == exitcodes.USAGE
    line = _one_line(proc.stderr)
    assert f"--rdzv-endpoint 127.0.0.1:{port}: the port is already in use" in line and "free port" in line


def _events_dir(tmp: Path, content: bytes) -> Path:
    run = tmp / "run"
    (run / "events").mkdir(parents=True)
    good = {"ts": 1.0, "kind": "start", "role": "trainer", "rank": 0, "world_size": 1}
    (run / "events" / "trainer-rank0.jsonl").write_bytes(json.dumps(good).encode() + b"\n" + content + b"\n")
    return run


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"kind": "step", "step": 1}', "trainer-rank0.jsonl:2: event without a numeric 'ts' (got None)"),
        (
            b'{"ts": "soon", "kind": "step"}',
            "trainer-rank0.jsonl:2: event without a numeric 'ts' (got 'soon')",
        ),
        (b'{"ts": 2.0, "kind": "st\xffep"}', "trainer-rank0.jsonl:2: byte 23 is not UTF-8"),
        (b"[1, 2]", "trainer-rank0.jsonl:2: not a JSON object"),
    ],
)
def test_report_names_the_bad_events_line(tmp_path: Path, content: bytes, message: str, capsys) -> None:
    run = _events_dir(tmp_path, content)
    assert report.main([str(run), "--no-png"]) == exitcodes.USAGE
    line = _one_line(capsys.readouterr().err)
    assert message in line and "remove" in line


@pytest.mark.parametrize("out", ["file", "file/sub", "/proc/kit-no-such/x"])
def test_make_shards_refuses_an_out_that_is_a_file_or_cannot_be_made(
    tmp_path: Path, out: str, capsys
) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("hello")
    (tmp_path / "file").write_text("not a folder")
    target = out if out.startswith("/") else str(tmp_path / out)
    assert make_shards.main([str(doc), "--out", target]) == exitcodes.FATAL_CONFIG
    line = _one_line(capsys.readouterr().err)
    assert repr(target) in line and (
        "pick a new or empty folder" in line or "pick a folder you can write" in line
    )
    assert (tmp_path / "file").read_text() == "not a folder"
