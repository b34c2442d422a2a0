"""Numbers derived from trusted JobValues (world size, restarts, /dev/shm size): pure functions, one place.

The rules (`fsdpkit.k8s.rules`) and the template context (`fsdpkit.k8s.spec`) both use them, so a number is
computed the same way where it is checked and where it is rendered.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fsdpkit.k8s.model import (
    CKPT_BYTES_PER_PARAM,
    DRAIN_MARGIN_S,
    FT_AUTO_HEARTBEAT_S,
    LAUNCHER_DEFAULT_RESTARTS,
    MODEL_PARAMS,
)
from fsdpkit.k8s.profiles import get_profile

if TYPE_CHECKING:
    from fsdpkit.k8s.model import JobValues


def world_size(v: JobValues) -> int:
    return v.nodes * procs_per_node(v)


def procs_per_node(v: JobValues) -> int:
    profile = get_profile(v.profile)
    return v.procs_per_node if v.procs_per_node is not None else max(profile.gpus, 1)


def max_restarts(v: JobValues) -> int:
    return v.max_restarts if v.max_restarts is not None else LAUNCHER_DEFAULT_RESTARTS[v.launcher]


def staging_gib(v: JobValues) -> float:
    """Bytes one node stages per async checkpoint, GiB: the model's checkpoint split over the nodes."""
    model = v.model or get_profile(v.profile).default_model
    return MODEL_PARAMS[model] * CKPT_BYTES_PER_PARAM / v.nodes / 2**30


TIER_COPIES = {"peer": 4, "local": 2, "off": 0}
"""Node shares of the checkpoint a pod's /dev/shm holds at most with each tier setting (one step kept):
the kept step and the one being written, for its own ranks, and as many for its buddy's with peer."""


def tier_keep(v: JobValues) -> int:
    """TRAIN.checkpoint.tier_keep, else the trainer's default (1)."""
    keep = v.train.get("checkpoint", {}).get("tier_keep", 1)
    return keep if isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1 else 1


def tier_gib(v: JobValues, tiers: str) -> float:
    """What the memory tiers hold in one pod's /dev/shm at most, GiB."""
    return TIER_COPIES[tiers] * (tier_keep(v) + 1) / 2 * staging_gib(v)


def tiers(v: JobValues) -> str:
    """The memory tiers the pods run: CHECKPOINT_TIERS, or for auto the most that fits in half the pod's
    memory (as SHM_GIB must) under the kit launcher and writer: peer (two nodes or more), local, off."""
    if v.checkpoint_tiers != "auto":
        return v.checkpoint_tiers
    if v.launcher != "kit" or v.checkpoint_mode == "off":  # the kit launcher owns each node's tier folder
        return "off"
    if v.checkpoint_mode == "async" and v.checkpoint_backend in ("dcp", "nvrx"):
        return "off"
    room = v.shm_gib if v.shm_gib is not None else get_profile(v.profile).memory_gib // 2
    for choice in ("peer", "local") if v.nodes > 1 else ("local",):
        if tier_gib(v, choice) <= room:
            return choice
    return "off"


def shm_gib(v: JobValues) -> int:
    """/dev/shm size: the explicit value, else what the memory tiers hold, at least twice the staging size and
    the profile's minimum."""
    if v.shm_gib is not None:
        return v.shm_gib
    need = max(2 * staging_gib(v), tier_gib(v, tiers(v)))
    return max(get_profile(v.profile).shm_min_gib, math.ceil(need))


def heartbeat_seconds(v: JobValues) -> float | None:
    """The numeric heartbeat timeout the launcher gets (ft_launcher's "auto" is the study's 900 s)."""
    if v.heartbeat_timeout != "auto":
        return float(v.heartbeat_timeout)
    return FT_AUTO_HEARTBEAT_S if v.launcher == "ft_launcher" else None


def grace_needed_s(v: JobValues) -> int:
    """Shortest terminationGracePeriodSeconds that lets a drained job save without losing a step: the save in
    flight and the drain's own save (each the whole checkpoint, all nodes sharing the file system's write
    speed), plus one step, the commit and the exit (DRAIN_MARGIN_S)."""
    checkpoint_mib = staging_gib(v) * v.nodes * 1024
    return math.ceil(2 * checkpoint_mib / v.checkpoint_write_mib_s + DRAIN_MARGIN_S)


def termination_grace_s(v: JobValues) -> int:
    return v.termination_grace_s if v.termination_grace_s is not None else grace_needed_s(v)


def checkpoint_interval(v: JobValues) -> int | str | None:
    """checkpoint.interval as the Job renders it: CHECKPOINT_INTERVAL, else the profile's default (auto on the
    GPU profiles, what the plan would pick); None (the trainer's default) with checkpoints off."""
    if v.checkpoint_interval is not None or v.checkpoint_mode == "off":
        return v.checkpoint_interval
    return get_profile(v.profile).checkpoint_interval
