"""The kit's heartbeat launcher: `python -m fsdpkit.launcher [FLAGS] -m fsdpkit.trainer ARGS...`.

torchrun's engine (torch.distributed.elastic: worker groups, restart budget, multi-node restarts; the kit's
rendezvous by default, training/launcher/rendezvous/) with what the kit adds: hang detection from
per-step heartbeats, a never-retry exit code, SIGKILL restarts of a broken group, and warm workers forked
from a zygote that already imported torch (a restart does not pay the 2-2.6 s import again). Flags keep
torchrun's names where they mean the same thing; see docs/launcher.md. They are exact (never abbreviated),
and every word after the target (SCRIPT, -m MODULE, or the word after `--`) is the target's, byte for
byte (`split_command`).

Exit codes (training/contracts/exitcodes.py): 0 every worker finished (nothing else: a hang with no restart
left is 75); 75 the restart budget is spent, or the node was given up; 78 a worker exited 78 (bad config:
never retried), or the target module/script is missing or TMPDIR cannot hold the zygote's socket (checked
before anything starts); 69 the run this pod was to join ended in failure (the Job fails); 2 a bad command
line or a rendezvous port in use; 128+N the launcher got signal N.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from fsdpkit.contracts import env, exitcodes
from fsdpkit.contracts.metrics_settings import MetricsSettings, MetricsSettingsError
from fsdpkit.launcher.args import LaunchArgs
from fsdpkit.launcher.shim import RANK_RESTART_ENV, ZYGOTE_SOCKET_NAME
from fsdpkit.runtime.run_token import RunTokenError, run_key

log = logging.getLogger("kit.launch")
RDZV_DEFAULTS = {
    "kit": {"keep_alive_interval": "0.1", "keep_alive_max_attempt": "12"},
    "c10d": {"keep_alive_interval": "0.25", "keep_alive_max_attempt": "5"},
}
"""Per backend. torchelastic's defaults (5 s x 3) take 15 s to declare a silently dead node. The kit's: a
beat of a few bytes every 0.1 s; a silent node is gone after 3x its own recent beat gap (0.36 s on a quiet
host), never after more than 1.2 s (training/launcher/rendezvous/liveness.py). c10d: every keep-alive writes
the whole state, so 0.25 s x 5 (1.25 s; a live node's keep-alive may stall 1 s; rendezvous/c10d.py).
Override with --rdzv-conf."""
KEEP_ALIVE_S_RANGE = (0.1, 60.0)
"""Allowed keep_alive_interval, seconds: below 0.1 s 64 nodes would write the whole rendezvous state over
640 times a second; above 60 s a dead node holds the job for minutes."""
KEEP_ALIVE_ATTEMPTS_MAX = 100
KEEP_ALIVE_STALL_MIN_S = 1.0
"""Least (keep_alive_max_attempt - 1) x keep_alive_interval: how long a live node's keep-alive may stall
before the rendezvous drops it. Healthy processes were seen stalled 0.6-0.75 s on a busy 2-core machine."""
INTERRUPT_GRACE_MAX_S = 600.0
"""The longest wait for an interrupted rank's next beat (--hang-interrupt-grace) before the group restart."""
UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes on Linux, the terminating NUL included."""


class _Parser(argparse.ArgumentParser):
    """argparse with exact option names (no abbreviations: `--log` is not `--log-dir`), keeping each
    option's action by name (`options`: how `split_command` finds where the target starts)."""

    def __init__(self, **kwargs: Any) -> None:
        self.options: dict[str, argparse.Action] = {}
        """Option string -> its action, in --help's order (`-h` first: the base class adds it)."""
        super().__init__(allow_abbrev=False, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.update(dict.fromkeys(action.option_strings, action))
        return action

    def error(self, message: str) -> NoReturn:
        self.exit(exitcodes.USAGE, f"kit-launch: error: {message} (see --help)\n")


def _positive_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds > 0, got {text!r}")
        return value

    return parse


def _heartbeat_timeout(text: str) -> float | None:
    if text == "auto":
        return None
    return _positive_float("--heartbeat-timeout (or 'auto')")(text)


def _interrupt_grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value <= INTERRUPT_GRACE_MAX_S):
        raise argparse.ArgumentTypeError(
            f"--hang-interrupt-grace must be seconds in [0, {INTERRUPT_GRACE_MAX_S:g}] (0: off), got {text!r}"
        )
    return value


def _safety_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 1 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"--heartbeat-safety-factor must be a number >= 1, got {text!r}")
    return value


def _nonneg_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= 0, got {text!r}")
        return int(text)

    return parse


def _nnodes(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise argparse.ArgumentTypeError(f"--nnodes must be N or MIN:MAX, got {text!r}")
    lo, hi = int(low), int(high) if sep else int(low)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"--nnodes needs 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _add(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Register --a-b and torchrun's --a_b spelling."""
    names = [name] + ([name.replace("-", "_").replace("__", "--", 1)] if "-" in name[2:] else [])
    parser.add_argument(*names, **kwargs)


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    _add(p, "--nnodes", type=_nnodes, default=(1, 1), help="nodes: N or MIN:MAX (default 1)")
    _add(p, "--nproc-per-node", type=_nonneg_int("--nproc-per-node"), default=1, help="workers per node")
    _add(p, "--node-rank", type=_nonneg_int("--node-rank"), default=0, help="node rank (static rendezvous)")


def _add_rendezvous_flags(p: argparse.ArgumentParser) -> None:
    _add(
        p,
        "--rdzv-backend",
        choices=["kit", "c10d", "static"],
        default="kit",
        help="rendezvous backend: kit (O(1) store traffic per node, training/launcher/rendezvous/), "
        "c10d (torch's, with the kit's spares), static",
    )
    _add(p, "--rdzv-endpoint", default="", help="HOST:PORT of the rendezvous store")
    _add(p, "--rdzv-id", default="", help="job id shared by all nodes")
    _add(p, "--rdzv-conf", default="", help="extra rendezvous settings, KEY=VALUE,... (e.g. is_host=1)")
    _add(p, "--standalone", action="store_true", help="single node, local rendezvous on a free port")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _add(p, "--max-restarts", type=_nonneg_int("--max-restarts"), default=3, help="restart budget")
    _add(
        p,
        "--monitor-interval",
        type=_positive_float("--monitor-interval"),
        default=0.1,
        help="seconds between worker checks",
    )
    _add(p, "--log-dir", default=None, help="folder for worker logs (torchelastic layout)")
    _add(p, "--run-dir", default=None, help="run folder; launcher events go to <run-dir>/events/")


def _add_heartbeat_flags(p: argparse.ArgumentParser) -> None:
    _add(
        p,
        "--heartbeat-timeout",
        type=_heartbeat_timeout,
        default=None,
        metavar="auto|SECONDS",
        help="step timeout in the train phase; auto (default) learns it from step intervals",
    )
    _add(
        p,
        "--heartbeat-load-timeout",
        type=_positive_float("--heartbeat-load-timeout"),
        default=600.0,
        help="allowance while a rank starts, loads or saves a checkpoint, seconds (default 600)",
    )
    _add(
        p,
        "--heartbeat-safety-factor",
        type=_safety_factor,
        default=1.5,
        help="auto timeout = factor x the slowest recent step time (default 1.5)",
    )
    _add(
        p,
        "--heartbeat-min-timeout",
        type=_positive_float("--heartbeat-min-timeout"),
        default=0.3,
        help="floor of the auto timeout, seconds (default 0.3; a rank still busy on a CPU gets up to 3 x "
        "its timeout before it counts as hung)",
    )
    _add(
        p,
        "--hang-interrupt-grace",
        type=_interrupt_grace,
        default=2.0,
        help="a hung rank whose trainer restarts in process is first interrupted (SIGUSR1: an exception "
        "in its training thread) and the group is restarted only if it does not beat again within this "
        "many seconds (default 2; 0: restart the group at once)",
    )


def _add_worker_flags(p: argparse.ArgumentParser) -> None:
    _add(
        p,
        "--worker-start",
        choices=["zygote", "exec"],
        default="zygote",
        help="zygote: fork warm workers that already imported torch (default); exec: a fresh python",
    )
    _add(p, "--shutdown-timeout", type=_nonneg_int("--shutdown-timeout"), default=30, help="SIGTERM grace, s")
    _add(
        p,
        "--rank-restart",
        choices=["group", "in-place"],
        default="group",
        help="group: a crashed worker restarts the worker group (default); in-place: it is started again "
        "alone and rejoins its peers, which restart in process and restore it from a live replica (HSDP "
        "with inprocess.enabled; needs warm workers; a crash of rank 0, which hosts the stores, restarts "
        "the group)",
    )


def _add_spare_flags(p: argparse.ArgumentParser) -> None:
    _add(
        p,
        "--spares",
        type=_nonneg_int("--spares"),
        default=0,
        help="hot spares beside --nnodes: nodes with --node-rank >= NNODES wait warm in the rendezvous "
        "(torchelastic's redundancy list) and replace a lost node at once; a spare left at the end exits 0",
    )
    _add(
        p,
        "--node-failure-limit",
        type=_nonneg_int("--node-failure-limit"),
        default=None,
        help="give this node up after this many failures of its own within --node-failure-window "
        "(a worker killed by a signal, or a hang that is its own); 0 never gives up. Default: 3 with "
        "--spares (a spare takes the node's place), else 0 (giving up the only copy of a node ends the job)",
    )
    _add(
        p,
        "--node-failure-window",
        type=_positive_float("--node-failure-window"),
        default=600.0,
        help="seconds over which --node-failure-limit counts (default 600)",
    )


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    _add(p, "--no-python", action="store_true", help="run the target as a program, not with python")
    p.add_argument("training_script", help="module (with -m), script or program to run on every worker")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)


FLAG_GROUPS: tuple[Callable[[argparse.ArgumentParser], None], ...] = (
    _add_node_flags,
    _add_rendezvous_flags,
    _add_run_flags,
    _add_heartbeat_flags,
    _add_worker_flags,
    _add_spare_flags,
    _add_target_flags,
)
"""The flags in --help's order: each adds its own, all in the one options list."""


def build_parser() -> _Parser:
    p = _Parser(
        prog="kit-launch",
        description="Heartbeat launcher on torch.distributed.elastic (torchrun's flags, plus heartbeats).",
    )
    for add_flags in FLAG_GROUPS:
        add_flags(p)
    return p


def split_command(parser: _Parser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the launcher's words: its options and the target, the target's own arguments).

    The target is the first word that is neither a launcher option nor an option's value (the module after
    `-m` is such a word), or the word after `--`. Everything after it belongs to the script, byte for byte:
    argparse never reads it (its scan of every word would refuse `--log` as an abbreviation of `--log-dir`
    even after the script, and the positional before the REMAINDER list takes a `--` that follows it). A
    word before the target that is no launcher option is refused here (`_Refused`), naming the options it
    could be short for."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[: i + 2], argv[i + 2 :]
        if not word.startswith("-") or word == "-":
            return argv[: i + 1], argv[i + 1 :]
        name, equals, _ = word.partition("=")
        action = parser.options.get(name)
        if action is None:
            raise _Refused(_unknown_option(parser, name))
        i += 1 if equals or action.nargs == 0 else 2  # every launcher flag takes one value or none
    return argv, []


def _unknown_option(parser: _Parser, name: str) -> str:
    """One line for a word before the target that is no launcher option: the exact options it begins,
    else where the target's own options go."""
    names: list[str] = []
    seen: set[argparse.Action] = set()
    for option, action in parser.options.items():  # an action's first spelling: --log-dir, not --log_dir
        if option.startswith(name) and action not in seen:
            seen.add(action)
            names.append(option)
    if not names:
        return (
            f"{name} is not a launcher option; the script's own options go after it "
            "(kit-launch [OPTIONS] SCRIPT ARGS... or -m MODULE ARGS...)"
        )
    exact = names[0] if len(names) == 1 else "one of " + ", ".join(names)
    return f"{name} is not a launcher option (options are exact, never abbreviated): did you mean {exact}?"


RDZV_TIMEOUT_KEYS = ("join_timeout", "last_call_timeout", "close_timeout")
RDZV_TIMEOUT_MAX_S = 7 * 24 * 3600
BOOLEAN_SPELLINGS = ("1", "0", "true", "false", "t", "f", "yes", "no", "y", "n")
"""What torch's RendezvousParameters.get_as_bool reads (any case)."""


def rdzv_conf_problem(configs: dict[str, str]) -> str:
    """One line naming a rendezvous timeout that is not whole seconds in range, or an is_host that is not a
    boolean; empty when they are fine (torch would read 0 as its default, or fail at start-up)."""
    for key in RDZV_TIMEOUT_KEYS:
        if key in configs and not (configs[key].isdigit() and 1 <= int(configs[key]) <= RDZV_TIMEOUT_MAX_S):
            return f"{key}={configs[key]!r} must be whole seconds in [1, {RDZV_TIMEOUT_MAX_S}]"
    if configs.get("is_host", "1").lower() not in BOOLEAN_SPELLINGS:
        return f"is_host={configs['is_host']!r} must be 1 or 0 (true/false, yes/no)"
    return ""


def keep_alive_problem(interval: str, attempts: str) -> str:
    """What is wrong with a keep-alive setting, in one line naming the keys; empty when it is fine."""
    lo, hi = KEEP_ALIVE_S_RANGE
    try:
        seconds, count = float(interval), int(attempts)
    except ValueError:
        seconds, count = math.nan, 0
    if not (lo <= seconds <= hi and 2 <= count <= KEEP_ALIVE_ATTEMPTS_MAX):
        return (
            f"keep_alive_interval={interval!r} must be seconds in [{lo:g}, {hi:g}] and "
            f"keep_alive_max_attempt={attempts!r} a whole number in [2, {KEEP_ALIVE_ATTEMPTS_MAX}]"
        )
    if (count - 1) * seconds < KEEP_ALIVE_STALL_MIN_S:
        return (
            f"keep_alive_interval={interval} x (keep_alive_max_attempt={attempts} - 1) must be at least "
            f"{KEEP_ALIVE_STALL_MIN_S:g} s, or a live node whose keep-alive stalls that long is dropped "
            f"(e.g. 0.1 x 12, or 0.25 x 5)"
        )
    return ""


class _Refused(ValueError):
    """A command line the checks refuse; its text is the one-line error."""


@dataclass(frozen=True, kw_only=True)
class _Command:
    """The parsed flags, with the rendezvous resolved (--standalone, or one node without an endpoint: the
    kit's rendezvous on a free local port, under a new job id unless one is given)."""

    flags: argparse.Namespace
    min_nodes: int
    max_nodes: int
    standalone: bool
    backend: str
    endpoint: str
    run_id: str

    @classmethod
    def of(cls, a: argparse.Namespace) -> _Command:
        min_nodes, max_nodes = a.nnodes
        backend, endpoint, run_id = a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id
        standalone = a.standalone or (max_nodes == 1 and not endpoint)
        if standalone:
            backend, endpoint, run_id = "kit", "127.0.0.1:0", run_id or str(uuid.uuid4())
        return cls(
            flags=a,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            standalone=standalone,
            backend=backend,
            endpoint=endpoint,
            run_id=run_id,
        )


def _workers_per_node(c: _Command) -> str | None:
    return "--nproc-per-node must be >= 1" if c.flags.nproc_per_node < 1 else None


def _standalone_is_one_node(c: _Command) -> str | None:
    return (
        "--standalone runs one node; drop it or use --nnodes=1" if c.standalone and c.max_nodes > 1 else None
    )


def _endpoint_given(c: _Command) -> str | None:
    if c.standalone or c.endpoint:
        return None
    return f"--rdzv-endpoint HOST:PORT is required for {c.max_nodes} nodes (the host of node 0)"


def _job_id_given(c: _Command) -> str | None:
    return None if c.run_id else "--rdzv-id is required with --rdzv-endpoint (the same job id on every node)"


def _static_is_fixed(c: _Command) -> str | None:
    if c.backend == "static" and c.min_nodes != c.max_nodes:
        return "--rdzv-backend=static needs a fixed --nnodes=N; use kit or c10d for MIN:MAX"
    return None


def _spares_have_a_place(c: _Command) -> str | None:
    if c.flags.spares and c.backend == "static":
        return "--spares needs the kit or c10d rendezvous (static has no place for a spare)"
    if c.flags.spares and c.backend == "c10d" and c.min_nodes != c.max_nodes:
        return "--spares with c10d needs a fixed --nnodes=N (the kit rendezvous takes MIN:MAX with them)"
    return None


def _node_rank_in_range(c: _Command) -> str | None:
    nodes = c.max_nodes + c.flags.spares
    if c.flags.node_rank >= nodes:
        return f"--node-rank={c.flags.node_rank} must be below --nnodes + --spares ({nodes})"
    return None


def _in_place_has_warm_workers(c: _Command) -> str | None:
    if c.flags.rank_restart == "in-place" and (c.flags.worker_start != "zygote" or c.flags.no_python):
        return "--rank-restart in-place needs warm workers (--worker-start zygote, a Python target)"
    return None


COMMAND_CHECKS: tuple[Callable[[_Command], str | None], ...] = (
    _workers_per_node,
    _in_place_has_warm_workers,
    _standalone_is_one_node,
    _endpoint_given,
    _job_id_given,
    _static_is_fixed,
    _spares_have_a_place,
    _node_rank_in_range,
)
"""The rules across flags, in the order they are checked: the first broken one is the error."""


def _rdzv_configs(c: _Command) -> dict[str, str]:
    """--rdzv-conf's KEY=VALUE items with the backend's defaults, checked (torch would read a bad value as
    its default, or fail at start-up)."""
    configs: dict[str, str] = {}
    for item in filter(None, c.flags.rdzv_conf.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _Refused(f"--rdzv-conf item {item!r} is not KEY=VALUE")
        if key.strip() in configs:
            raise _Refused(f"--rdzv-conf gives {key.strip()} twice; give each key once")
        configs[key.strip()] = value.strip()
    if c.standalone:
        if "is_host" in configs:
            raise _Refused(
                "--rdzv-conf is_host: --standalone hosts the rendezvous store itself; drop is_host"
            )
        configs["is_host"] = "1"
    for key, value in RDZV_DEFAULTS["c10d" if c.backend == "c10d" else "kit"].items():
        configs.setdefault(key, value)
    problem = keep_alive_problem(configs["keep_alive_interval"], configs["keep_alive_max_attempt"])
    problem = problem or rdzv_conf_problem(configs)
    if problem:
        raise _Refused(f"--rdzv-conf {problem}")
    if c.backend == "static":
        configs["rank"] = str(c.flags.node_rank)
    return configs


def _metrics(c: _Command) -> MetricsSettings:
    """The launcher's metrics settings from the pod's env, under the trainer's JobName: its run id, the run
    folder's name (the same here, also with --standalone)."""
    job = os.path.basename(os.path.normpath(c.flags.run_dir)) if c.flags.run_dir else c.run_id
    try:
        return MetricsSettings.from_env(os.environ, run_id=job)
    except MetricsSettingsError as exc:
        raise _Refused(str(exc)) from exc


def parse_args(argv: list[str]) -> LaunchArgs:
    """The checked command line; a bad one exits 2 with one line."""
    parser = build_parser()
    try:
        words, script_args = split_command(parser, argv)
    except _Refused as exc:
        parser.error(str(exc))
    flags = parser.parse_args(words)
    flags.training_script_args = script_args  # the script's words, byte for byte (never parsed here)
    command = _Command.of(flags)
    try:
        for check in COMMAND_CHECKS:
            if (problem := check(command)) is not None:
                raise _Refused(problem)
        configs = _rdzv_configs(command)
        metrics = _metrics(command)
        if command.flags.module and command.flags.no_python:
            raise _Refused("-m/--module and --no-python exclude each other")
    except _Refused as exc:
        parser.error(str(exc))
    return _launch_args(command, configs, metrics)


def _launch_args(c: _Command, configs: dict[str, str], metrics: MetricsSettings) -> LaunchArgs:
    a = c.flags
    target = [a.training_script, *a.training_script_args]
    if a.no_python:
        entrypoint, worker_argv = a.training_script, list(a.training_script_args)
    else:
        entrypoint, worker_argv = sys.executable, ["-u", *(["-m"] if a.module else []), *target]
    return LaunchArgs(
        min_nodes=c.min_nodes,
        max_nodes=c.max_nodes,
        nproc_per_node=a.nproc_per_node,
        node_rank=a.node_rank,
        rdzv_backend=c.backend,
        rdzv_endpoint=c.endpoint,
        rdzv_id=c.run_id,
        rdzv_configs=configs,
        max_restarts=a.max_restarts,
        monitor_interval=a.monitor_interval,
        log_dir=a.log_dir,
        run_dir=a.run_dir,
        heartbeat_timeout_s=a.heartbeat_timeout,
        heartbeat_load_timeout_s=a.heartbeat_load_timeout,
        heartbeat_safety_factor=a.heartbeat_safety_factor,
        heartbeat_min_timeout_s=a.heartbeat_min_timeout,
        hang_interrupt_grace_s=a.hang_interrupt_grace,
        zygote=a.worker_start == "zygote" and not a.no_python,
        shutdown_timeout=a.shutdown_timeout,
        rank_restart=a.rank_restart,
        spares=a.spares,
        node_failure_limit=a.node_failure_limit
        if a.node_failure_limit is not None
        else (3 if a.spares else 0),
        node_failure_window_s=a.node_failure_window,
        entrypoint=entrypoint,
        argv=worker_argv,
        target_kind="program" if a.no_python else "module" if a.module else "script",
        target=a.training_script,
        metrics=metrics,
    )


def check_target(args: LaunchArgs) -> str | None:
    """Why the workers' target cannot start (one line), or None. A missing module would fail every restart."""
    if args.target_kind == "module":
        try:
            found = importlib.util.find_spec(args.target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (
                f"-m {args.target}: no such module on the Python path (from {os.getcwd()!r}); "
                "check its spelling, the working directory or PYTHONPATH"
            )
    elif args.target_kind == "script" and not os.path.isfile(args.target):
        return f"script {args.target!r} not found; pass an existing file, or -m MODULE"
    elif args.target_kind == "program" and shutil.which(args.target) is None:
        return f"--no-python program {args.target!r} not found or not executable; pass a program on PATH"
    return None


def check_socket_folder(workdir: str) -> str | None:
    """The zygote's Unix socket lives in the launcher's temp folder; a long TMPDIR cannot hold one."""
    path = os.fsencode(os.path.join(workdir, ZYGOTE_SOCKET_NAME))
    if len(path) > UNIX_PATH_MAX:
        return (
            f"TMPDIR={tempfile.gettempdir()!r} is too long for the warm workers' Unix socket "
            f"({len(path)} > {UNIX_PATH_MAX} bytes); set TMPDIR to a shorter folder (e.g. /tmp) "
            "or pass --worker-start exec"
        )
    return None


def _workdir_parent() -> str | None:
    """Where the launcher's temp folder (heartbeats, stacks, the zygote's socket) goes: $TMPDIR when set;
    else /dev/shm, memory (the kit's pods mount one), so a rank's per-step heartbeat (a small file replaced
    by rename) never waits on a disk's journal; else tempfile's default. On the test VM's ext4 (2026-12-02),
    while another process wrote, fsynced and deleted 25 MB files, that write + rename took up to 676 ms
    (p99 26 ms; 4 ms on /dev/shm); both ranks stopped between steps for up to 0.9 s in a 2,000-step run."""
    if os.environ.get("TMPDIR") or not (os.path.isdir(env.SHM) and os.access(env.SHM, os.W_OK | os.X_OK)):
        return None
    return env.SHM


def _make_tier_dir() -> str | None:
    """The node's memory-tier folder (fsdpkit.resilience.checkpoint.tier): in memory, made by the launcher
    and removed when it exits, so it outlives every worker and no pod's replacement inherits it. None (and
    the tiers stay off, said once by the trainer) when no memory-backed folder can be written."""
    base = os.environ.get(env.TIER_BASE) or env.SHM
    try:
        os.makedirs(base, exist_ok=True)
        return tempfile.mkdtemp(prefix="kit-tier-", dir=base)
    except OSError as exc:
        log.warning(
            "kit-launch: no memory tier on this node (%s: %s); restores read shared storage", base, exc
        )
        return None


def _prepare_environment(workdir: str) -> None:
    """Env the workers and the rendezvous handler read; set before torch creates anything."""
    from fsdpkit.runtime import pod

    os.environ.setdefault(pod.POD_ROOT_ENV, str(os.getpid()))  # the pod, when no Job names one
    if os.getpid() == 1:  # a container's PID 1 ignores SIGKILL from inside: the `node` fault uses this
        signal.signal(pod.PID1_EXIT_SIGNAL, lambda *_: os._exit(128 + signal.SIGKILL))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; 2 threads/rank is slower on CPU
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1") != "1":
        log.warning(
            "kit-launch: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=%s: restarted gloo workers may read stale "
            "store keys (pytorch/pytorch#135712); unset it to get the kit's default (1)",
            os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"],
        )
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Every node runs --nproc-per-node workers of one role: torch then numbers them without a store round
    # (group rank x local world + local rank, what its O(N) gather on node 0 computes anyway).
    os.environ.setdefault("TORCH_ELASTIC_WORKER_IDENTICAL", "1")
    from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV

    os.environ[HEARTBEAT_DIR_ENV] = os.path.join(workdir, "heartbeat")
    from fsdpkit.runtime.stacks import STACKS_DIR_ENV

    os.environ[STACKS_DIR_ENV] = os.path.join(workdir, "stacks")
    os.makedirs(os.environ[STACKS_DIR_ENV])


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.run_dir is not None:
        try:
            os.makedirs(args.run_dir, exist_ok=True)
        except OSError as exc:
            print(f"kit-launch: error: cannot create --run-dir {args.run_dir!r}: {exc}", file=sys.stderr)
            return exitcodes.USAGE
    problem = check_target(args)
    if problem is not None:
        print(f"kit-launch: error: {problem}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG  # the same on every restart and every pod: fail the Job at once
    try:
        run_key()  # read once here: a bad token file fails the Job before any store is reached
    except RunTokenError as exc:
        print(f"kit-launch: error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    parent = _workdir_parent()
    try:
        workdir = tempfile.mkdtemp(prefix="kit-launch-", dir=parent)
    except OSError as exc:
        print(
            f"kit-launch: error: cannot create a temp folder in {parent or tempfile.gettempdir()!r}: "
            f"{exc.strerror}; "
            "set TMPDIR to a writable folder",
            file=sys.stderr,
        )
        return exitcodes.FATAL_CONFIG
    tier_dir = _make_tier_dir()
    try:
        problem = check_socket_folder(workdir) if args.zygote else None
        if problem is not None:
            print(f"kit-launch: error: {problem}", file=sys.stderr)
            return exitcodes.FATAL_CONFIG
        _prepare_environment(workdir)

        os.environ[env.SPARES] = str(args.spares)  # the straggler policy `replace` evicts only with spares
        if args.rank_restart == "in-place":
            os.environ[RANK_RESTART_ENV] = "in-place"  # read by each worker's shim (launcher/shim.py)
        if tier_dir is not None:
            os.environ[env.TIER_DIR] = tier_dir
        from fsdpkit.launcher.runner import run  # imports torch: after the env is set

        return run(args, workdir=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if tier_dir is not None:
            shutil.rmtree(tier_dir, ignore_errors=True)


def entry() -> None:
    """The `kit-launch` console script: exits as an interpreter would, without its teardown (process_exit)."""
    from fsdpkit.runtime.process_exit import leave

    leave(main())


if __name__ == "__main__":
    entry()
