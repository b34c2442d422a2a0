"""JSON-lines events of a run (design, contract 3): one file per process under `<run_dir>/events/`.

Every metric is computed after the fact from these lines (`fsdpkit.analysis.metrics`), never in the loop.
A line is one write(2) to a file opened with O_APPEND, done before `emit` returns: it is in the OS (page
cache) at once, so it survives SIGKILL of the writer, and it is never fsynced (a lost node may lose its
last lines; the kit relies on none of them for a resume). One line is ~170-250 bytes.

Common fields on every line: ts (unix seconds, float), kind, role ("trainer" | "launcher"), rank
(global rank or null), pid, host, attempt (the launcher's restart count, TORCHELASTIC_RESTART_COUNT).

Kinds and their own fields:
  trainer:
    start         world_size, model, ckpt_mode
    resume        step (int | null), source ("shared" | "peer" | "memory" | "replica" | "live" | "none":
                  shared storage, another node's memory tier, this node's memory, a live replica's state
                  sent by rank `sender` (HSDP), the failed session's own state, nothing),
                  duration_s, fallback_from (int | null), bytes (restored from a memory tier or a
                  replica), shared_bytes (read from the shared checkpoint folder by this rank during this
                  restore). Runs from
                  before the memory tiers wrote "disk" for "shared"
    step          step, loss, duration_s (end - start of this step), t_start
    ckpt          step, phase ("stall" | "write" | "commit" | "failed" | "drain" | "skipped"), duration_s,
                  ts = the start of the phase,
                  bytes (optional), error (optional), waited (optional: "staging" when an optimizer step
                  waited for the host copy), reason (on "skipped")
    fault         fault (kind), step, target_rank (rank kinds) or target_node (node, freeze, drain: the pod
                  index): written by the injector just before it acts (for a time-based fault, step is the
                  last step reached, null if none yet)
    drained       step (committed before leaving), duration_s, signalled (this rank got the SIGTERM)
    interval      rank 0, checkpoint.interval=auto, when the chosen interval changes: interval, previous,
                  reason ("start" | "measured" | "history"), step, cost_s, step_s, write_steps, mtbf_s,
                  faults_seen, exposure_s, optimum_s (fsdpkit.resilience.checkpoint.interval)
    inprocess_restart  reason, restored_step, source ("live": the failed session's own state, nothing
                  computed again; "replica": a live replica's state (HSDP), only the interrupted step
                  computed again; "memory": the last save's host copy or the node's tier; "peer";
                  "shared"; "none"), why (why not live;
                  null when live), duration_s, iteration (NVRx Wrapper mode only)
    tier          the memory tiers (fsdpkit.resilience.checkpoint.memory_tiers): step, phase ("write": this
                  rank's copy written, bytes, staged (true: the save's host copy was staged
                  straight into it); "peer": its copy sent to its buddy and the neighbour's
                  received, bytes both ways, held_for (that neighbour's rank); "failed": stage, error (the
                  step is left to shared storage); "fallback": rank 0, a restore that memory could not
                  serve, reason), duration_s
    end           step (the final step)
    fault_unfired rank 0, after the final save: fault (in the grammar), planned_step, step (the last step
                  reached): a planned fault that never fired
    resharded     step, from_world, to_world, global_batch, duration_s: a resume onto another world size
    straggler     rank 0, once per confirmed straggler: step, target_rank, target_node, score, since_step,
                  compute_s, peers_s, evict, threshold (fsdpkit.resilience.straggler)
    straggler_node step, target_rank, pod, evict, node_name, cordoned: the slow node's own record, by its
                  local rank 0 when it is only reported (evict false), by its launcher (role "launcher")
                  after the cordon attempt when it is evicted (fsdpkit.launcher.node_actions)
  launcher:
    worker_failed local_rank, global_rank, exitcode (negative = signal number), reason, first (the rank that
                  failed first, by exit time; the others died after it)
    hang_detected global_rank (the rank that hung), stale_s, timeout_s, busy_extension_s (the time given past
                  the timeout while a rank was busy on a CPU), busy_ranks (still busy: the cap decided),
                  phase, step, ranks ({rank: "stopped" | "elsewhere" | "collective" | "unknown"}: where each
                  silent rank's main thread was), where, action ("interrupt": the rank is interrupted in
                  place, fsdpkit.runtime.hang_interrupt; "restart": the group is restarted)
    hang_interrupt_unanswered global_rank, grace_s, step: the interrupted rank did not beat again within the
                  grace (stuck outside Python): the group is restarted
    busy_extension global_rank, stale_s, timeout_s, busy_ranks, phase, step: a rank silent past its timeout
                  beat again while a rank was busy on a CPU (a restart the busy check saved)
    launcher_start node_rank, nodes, spares (a pod with node_rank >= nodes starts as a hot spare)
    spare_waiting node_rank: a spare waits warm for the first round to form
    rdzv_round    round, rank, world, asked_at, wait_s, beat_gap_max_s: this node is in a complete round of
                  the kit's rendezvous (asked at `asked_at`, epoch seconds; waited `wait_s`); its longest
                  gap between two rendezvous beats since its previous round
    rdzv_store_reconnected endpoint: the rendezvous store was lost and reached again (kit rendezvous)
    peer_gone     node, reason: a node of the last round whose rendezvous beat stopped while a local rank
                  waited (the group restarts to re-form without it)
    group_started attempt, ranks (global ranks of this node's workers): a worker group starts
    restart       attempt, reason, remaining (restart budget left)
    node_given_up node, failures, window_s, reason: the node failed by itself too often
    spare_exit    reason: a spare (or a replacement pod) was never needed and exits 0
    exit          code, reason
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fsdpkit.contracts.run_layout import EVENTS_DIR

Role = Literal["trainer", "launcher"]


def events_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / EVENTS_DIR


class EventLog:
    """Append-only JSON-lines writer for one process; thread-safe (the checkpoint writer logs too)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, *, role: Role, rank: int | None) -> None:
        self.role = role
        self.rank = rank
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._observers: list[Callable[[dict[str, Any]], None]] = []
        if run_dir is not None:
            folder = events_dir(run_dir)
            folder.mkdir(parents=True, exist_ok=True)
            who = f"rank{rank}" if rank is not None else "node"
            name = f"{role}-{who}-{self._host}-{self._pid}.jsonl"
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            self._fd = os.open(folder / name, flags, 0o644)

    def observe(self, observer: Callable[[dict[str, Any]], None]) -> None:
        """Call `observer` with every event from now on (the live metrics, fsdpkit.runtime.telemetry), on the
        emitting thread; one that raises is dropped with one line, and the event log goes on."""
        self._observers.append(observer)

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event now; a no-op when the log has no folder (e.g. a library caller) and no observer."""
        if self._fd is None and not self._observers:
            return
        record = {
            "ts": fields.pop("ts", None) or time.time(),
            "kind": kind,
            "role": self.role,
            "rank": self.rank,
            "pid": self._pid,
            "host": self._host,
            "attempt": self._attempt,
            **fields,
        }
        if self._fd is not None:
            line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
            with self._lock:
                if self._fd is not None:
                    os.write(self._fd, line)
        for observer in list(self._observers):
            try:
                observer(record)
            except Exception as exc:  # metrics must never end the process they watch
                if observer in self._observers:
                    self._observers.remove(observer)
                print(f"[events] an observer failed, dropped: {type(exc).__name__}: {exc}", file=sys.stderr)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a run, sorted by time; a torn last line (writer killed mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    for path in sorted(events_dir(run_dir).glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    events.sort(key=lambda e: e["ts"])
    return events
