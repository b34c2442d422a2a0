"""The launcher's command line: torchrun's flags, checked once, one-line errors (exit 2, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.cli import parse_args

REPO = Path(__file__).resolve().parents[2]


def test_contract_command_line_parses_with_torchrun_names() -> None:
    args = parse_args(
        [
            "--nnodes=2",
            "--nproc-per-node=4",
            "--node-rank=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=10.0.0.1:29400",
            "--rdzv-id=job-1",
            "--max-restarts=7",
            "--monitor-interval=0.5",
            "--heartbeat-timeout=auto",
            "--heartbeat-load-timeout=900",
            "--heartbeat-safety-factor=3",
            "--run-dir=/tmp/x",
            "-m",
            "fsdpkit.trainer",
            "--config",
            "f.yaml",
            "--training.steps",
            "5",
        ]
    )
    assert (args.min_nodes, args.max_nodes, args.nproc_per_node) == (2, 2, 4)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "10.0.0.1:29400", "job-1")
    assert (args.max_restarts, args.monitor_interval) == (7, 0.5)
    assert args.heartbeat_timeout_s is None and args.heartbeat_load_timeout_s == 900
    assert args.heartbeat_safety_factor == 3 and args.zygote
    assert args.entrypoint == sys.executable
    assert args.argv == ["-u", "-m", "fsdpkit.trainer", "--config", "f.yaml", "--training.steps", "5"]


def test_spares_and_the_kits_rendezvous_defaults() -> None:
    args = parse_args(
        ["--nnodes=2", "--spares=1", "--node-rank=2", "--rdzv-endpoint=s:1", "--rdzv-id=j",
         "--rdzv-conf=is_host=0", "-m", "fsdpkit.trainer"]
    )  # fmt: skip
    assert (args.spares, args.node_rank, args.max_nodes) == (1, 2, 2)
    elastic = parse_args(["--nnodes=2:3", "--spares=1", "--rdzv-endpoint=s:1", "--rdzv-id=j", "x.py"])
    assert (elastic.min_nodes, elastic.max_nodes, elastic.spares) == (2, 3, 1)  # a spare first, then shrink
    assert args.rdzv_configs == {"is_host": "0", "keep_alive_interval": "0.1", "keep_alive_max_attempt": "12"}
    c10d = parse_args(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=s:1", "--rdzv-id=j", "x.py"])
    assert c10d.rdzv_configs == {"keep_alive_interval": "0.25", "keep_alive_max_attempt": "5"}
    assert (args.node_failure_limit, args.node_failure_window_s) == (3, 600.0)
    given = parse_args(["--standalone", "--rdzv-conf=keep_alive_interval=2", "x.py"])
    assert given.rdzv_configs["keep_alive_interval"] == "2"


def test_underscore_spellings_and_standalone() -> None:
    args = parse_args(
        ["--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--heartbeat-timeout", "4", "x.py"]
    )
    assert args.rdzv_backend == "kit" and args.rdzv_endpoint == "127.0.0.1:0" and args.rdzv_id
    assert args.rdzv_configs["is_host"] == "1"
    assert args.nproc_per_node == 2 and args.max_restarts == 1 and args.heartbeat_timeout_s == 4.0
    assert args.argv == ["-u", "x.py"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc-per-node=0", "-m", "t"], "--nproc-per-node must be >= 1"),
        (["--nproc-per-node=two", "-m", "t"], "--nproc-per-node must be an integer >= 0, got 'two'"),
        (["--nnodes=2", "-m", "t"], "--rdzv-endpoint HOST:PORT is required for 2 nodes"),
        (["--nnodes=2", "--rdzv-endpoint=h:1", "-m", "t"], "--rdzv-id is required"),
        (["--nnodes=3:2", "-m", "t"], "--nnodes needs 1 <= MIN <= MAX, got '3:2'"),
        (
            ["--heartbeat-timeout=soon", "-m", "t"],
            "--heartbeat-timeout (or 'auto') must be a number of seconds",
        ),
        (["--heartbeat-timeout=-1", "-m", "t"], "must be a number of seconds > 0, got '-1'"),
        (["--heartbeat-safety-factor=0.5", "-m", "t"], "--heartbeat-safety-factor must be a number >= 1"),
        (["--monitor-interval=0", "-m", "t"], "--monitor-interval must be a number of seconds > 0"),
        (["--hang-interrupt-grace=nan", "-m", "t"], "--hang-interrupt-grace must be seconds in [0, 600]"),
        (["--hang-interrupt-grace=-1", "-m", "t"], "(0: off), got '-1'"),
        (["--standalone", "--nnodes=2", "-m", "t"], "--standalone runs one node"),
        (["--rdzv-conf=oops", "--standalone", "-m", "t"], "--rdzv-conf item 'oops' is not KEY=VALUE"),
        (["--rdzv-conf=join_timeout=0", "-m", "t"], "join_timeout='0' must be whole seconds in [1, 604800]"),
        (["--rdzv-conf=last_call_timeout=nan", "-m", "t"], "last_call_timeout='nan' must be whole seconds"),
        (
            ["--nnodes=2", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--rdzv-conf=is_host=maybe", "-m", "t"],
            "is_host='maybe' must be 1 or 0",
        ),
        (
            ["--rdzv-conf=join_timeout=5,join_timeout=9", "-m", "t"],
            "--rdzv-conf gives join_timeout twice; give each key once",
        ),
        (
            ["--standalone", "--rdzv-conf=is_host=0", "-m", "t"],
            "--standalone hosts the rendezvous store itself",
        ),
        (["--rdzv-backend=etcd", "-m", "t"], "invalid choice: 'etcd'"),
        (["--spares=-1", "-m", "t"], "--spares must be an integer >= 0, got '-1'"),
        (
            [
                "--nnodes=2:3",
                "--spares=1",
                "--rdzv-backend=c10d",
                "--rdzv-endpoint=h:1",
                "--rdzv-id=j",
                "-m",
                "t",
            ],
            "--spares with c10d needs a fixed --nnodes=N (the kit rendezvous takes MIN:MAX with them)",
        ),
        (
            ["--nnodes=2", "--spares=1", "--node-rank=3", "--rdzv-endpoint=h:1", "--rdzv-id=j", "-m", "t"],
            "--node-rank=3 must be below --nnodes + --spares (3)",
        ),
        (
            ["--standalone", "--rdzv-conf=keep_alive_interval=nan", "-m", "t"],
            "--rdzv-conf keep_alive_interval='nan' must be seconds in [0.1, 60]",
        ),
        (["--standalone", "--rdzv-conf=keep_alive_interval=inf", "-m", "t"], "must be seconds in [0.1, 60]"),
        (["--standalone", "--rdzv-conf=keep_alive_interval=1e9", "-m", "t"], "must be seconds in [0.1, 60]"),
        (
            ["--standalone", "--rdzv-conf=keep_alive_max_attempt=0", "-m", "t"],
            "keep_alive_max_attempt='0' a whole number in [2, 100]",
        ),
        (
            ["--standalone", "--rdzv-conf=keep_alive_interval=0.2,keep_alive_max_attempt=3", "-m", "t"],
            "keep_alive_interval=0.2 x (keep_alive_max_attempt=3 - 1) must be at least 1 s",
        ),
        (["--node-failure-window=0", "-m", "t"], "--node-failure-window must be a number of seconds > 0"),
        ([], "the following arguments are required: training_script"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", *argv],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exitcodes.USAGE
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_temp_folder_is_tmpdir_when_set_else_memory(monkeypatch, tmp_path: Path) -> None:
    """Heartbeats are replaced every step: in memory (/dev/shm) they never wait on a disk's journal; a TMPDIR
    the user set wins."""
    from fsdpkit.contracts import env
    from fsdpkit.launcher import cli as launch

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert launch._workdir_parent() is None, "TMPDIR set: tempfile's choice, i.e. TMPDIR"
    monkeypatch.delenv("TMPDIR")
    expected = env.SHM if os.access(env.SHM, os.W_OK | os.X_OK) else None
    assert launch._workdir_parent() == expected
    monkeypatch.setattr(env, "SHM", str(tmp_path / "absent"))
    assert launch._workdir_parent() is None, "no /dev/shm: tempfile's default"
