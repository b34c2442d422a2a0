"""The goodput model: what a job loses to checkpoints and faults, per recovery mechanism (docs/plan.md).

First order in the fault rate (faults are rare next to a step; each costs its downtime plus the work it throws
away, and they do not overlap), as Young (1974) and Daly (2006) model checkpointing:

    goodput = (1 - C / tau) x (1 - sum over classes c of  Lambda_c x (D_c + L_c))

  C        the stall of one save (the training loop blocked: the host copy for async saves, the whole write
           for sync saves)
  tau      seconds between saves: Young/Daly's optimum sqrt(2 C M) over the mean time M between faults that
           throw work away, never below the write of one save (one save at a time) nor one step
  Lambda_c faults of class c per second for the job: nodes x the class's rate per node-hour / 3600
  D_c      the mechanism's downtime for one fault of class c: detection, restart, re-forming the group,
           restore, and for a lost node with no spare left, the wait for its replacement
  L_c      the work a fault throws away: 0 when the mechanism resumes from the live state (an in-process
           restart) or saves at the boundary first (a drain); else the age of the newest committed save,
           tau / 2 on average, plus the write of one save for async saves (the save in flight is not
           committed yet)

A lost node finds a hot spare unless `spares` or more losses are already waiting for their replacements: with
losses Poisson at rate nodes x rate_node, that is P(Poisson(mu) < spares), mu = the losses expected during one
replacement. `spares_needed` inverts it for a target probability of running out.

The replica mechanism (`kit-replica`, HSDP: ops/plan/layout.py) recovers a lost node from a live replica of
its shards: the replacement receives the node's share of the training state over EFA at the current step,
so a node loss throws away only the interrupted step (half a step on average), and the kit saves for the
durable copy alone (at most hourly). Where no replica of a shard survives (R = 1, or every other holder of
the lost node's shards lost during the recovery: P = (1 - exp(-rate_node x D_node))^holders), it falls
back to the memory tiers (the kit's path, replaying since the last save).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from fsdpkit.ops.plan.failures import FAILURE_CLASSES, FailureClass, FailureRates, PlanInputError

Mechanism = Literal["kit-replica", "kit", "kit-no-tiers", "kit-no-spares", "ft_launcher", "torchrun"]
MECHANISMS: tuple[Mechanism, ...] = (
    "kit-replica", "kit", "kit-no-tiers", "kit-no-spares", "ft_launcher", "torchrun"
)  # fmt: skip
MECHANISM_TITLES = {
    "kit-replica": "kit + live replica (HSDP)",
    "kit": "kit (memory tiers, spares)",
    "kit-no-tiers": "kit without memory tiers",
    "kit-no-spares": "kit without spares",
    "ft_launcher": "NVRx ft_launcher",
    "torchrun": "torchrun / Kubernetes restart",
}


def _need(ok: bool, problem: str) -> None:
    if not ok:
        raise PlanInputError(problem)


def _finite(name: str, value: float, *, lo: float, lo_open: bool = False) -> None:
    ok = isinstance(value, int | float) and math.isfinite(value) and (value > lo if lo_open else value >= lo)
    _need(ok, f"{name}={value!r}: give a finite number {'>' if lo_open else '>='} {lo:g}")


@dataclass(frozen=True, kw_only=True)
class PhaseTimes:
    """Seconds each recovery phase takes (p5 projections; docs/plan.md gives each source)."""

    inprocess_restart_s: float = 10.0
    """An in-process restart, detection included (the study: ~10 s)."""
    ft_launcher_restart_s: float = 17.0
    """NVRx ft_launcher's restart of the ranks (the study: ~17 s), before the restore."""
    kubernetes_restart_s: float = 270.0
    """A Kubernetes restart of the whole job (the study: 270 s per fault), before the restore."""
    node_detect_s: float = 1.25
    """The kit's detection of a lost node (rendezvous keep-alive: 0.25 s x 5)."""
    reform_s: float = 1.0
    """The kit's re-forming of the group around a spare (bench.scale: ~0.4-1.0 s to 64 nodes)."""
    first_step_factor: float = 1.0
    """The first step after a restore, in steps (compiles and warm-up count here)."""
    replacement_s: float = 900.0
    """A lost node's replacement when no spare waits: EKS node repair, scheduling, image pull."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _finite(f.name, getattr(self, f.name), lo=0.0)


@dataclass(frozen=True, kw_only=True)
class Job:
    """The job to plan."""

    nodes: int
    step_s: float
    """Seconds per optimizer step."""
    checkpoint_gb: float
    """The whole training state one save writes (all nodes), GB."""
    shared_gbps: float
    """The shared file system's throughput for the whole job (FSx: per-TiB throughput x TiB), GB/s."""
    peer_gbps: float = 25.0
    """One node's restore rate from its buddy's memory over EFA, GB/s."""
    host_copy_gbps: float = 50.0
    """One node's device-to-host staging rate (the async save's stall), GB/s: 8 GPUs at ~6 GB/s each, a
    pageable copy's rate (pinned staging over PCIe Gen5 is faster; the figure is a projection)."""
    price_per_node_hour: float
    """USD per node-hour (`make plan` reads ops/prices.json for the configured instance and region)."""
    spares: int = 0
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    node_state_gb: float | None = None
    """The training state one node holds, GB: what a lost node's replacement must get back (HSDP: 12 B per
    parameter / S x 8 ranks); None: its share of one save (1-D FSDP)."""
    holders: int = 0
    """Other nodes holding a live copy of a lost node's shards (HSDP's replicas; 0 without)."""
    efa_gbps: float = 400.0
    """One node's EFA rate, GB/s (p5.48xlarge: 32 x 100 Gbps): a replica's state transfer."""

    def __post_init__(self) -> None:
        _need(
            isinstance(self.nodes, int) and self.nodes >= 1, f"nodes={self.nodes!r}: give a whole number >= 1"
        )
        _need(
            isinstance(self.spares, int) and self.spares >= 0,
            f"spares={self.spares!r}: give a whole number >= 0",
        )
        _finite("step_s", self.step_s, lo=0.0, lo_open=True)
        _finite("checkpoint_gb", self.checkpoint_gb, lo=0.0, lo_open=True)
        for name in ("shared_gbps", "peer_gbps", "host_copy_gbps", "price_per_node_hour", "efa_gbps"):
            _finite(name, getattr(self, name), lo=0.0, lo_open=True)
        if self.node_state_gb is not None:
            _finite("node_state_gb", self.node_state_gb, lo=0.0, lo_open=True)
        _need(
            isinstance(self.holders, int) and 0 <= self.holders < self.nodes,
            f"holders={self.holders!r}: give a whole number of other nodes, 0 to {self.nodes - 1}",
        )

    @property
    def per_node_gb(self) -> float:
        """A node's share of one save (each shard saved once, replicas splitting the write)."""
        return self.checkpoint_gb / self.nodes

    @property
    def node_gb(self) -> float:
        """What a lost node's replacement must get back."""
        return self.per_node_gb if self.node_state_gb is None else self.node_state_gb


@dataclass(frozen=True, kw_only=True)
class Costs:
    """One mechanism's price of a fault of each class and of a save."""

    stall_s: float
    write_s: float
    downtime_s: dict[str, float]
    loses_work: dict[str, float]
    """The share of a class's faults that resume from the newest save (replaying since it): 1 or 0, or the
    chance that no live replica survives."""
    async_save: bool
    interrupted_s: dict[str, float] = field(default_factory=dict)
    """Work a fault throws away beyond that: the interrupted step's half, on average (the replica path)."""
    max_interval_s: float = math.inf


def fallback_chance(job: Job, rates: FailureRates, window_s: float) -> float:
    """The chance a node loss finds no live replica of its shards: always without one; else every other
    holder of them lost too within `window_s` (the replica recovery), each node's losses Poisson at
    rate_node."""
    if job.holders == 0:
        return 1.0
    return (1.0 - math.exp(-rates.node * window_s / 3600.0)) ** job.holders


def _replica_costs(job: Job, rates: FailureRates, *, first: float, write_s: float, from_peer: float) -> Costs:
    """The replica mechanism: a lost node's state from a live replica over EFA, after the kit's detection
    and re-forming and an in-place restart's rejoin; the memory tiers where no replica survives. A drain
    still commits its step first (the kit's guarantee), then the node leaves as a lost one would."""
    p = job.phases
    transfer = job.node_gb / job.efa_gbps
    replica = p.node_detect_s + p.reform_s + p.inprocess_restart_s + transfer + first
    tiers = p.node_detect_s + p.reform_s + from_peer + first
    fallback = fallback_chance(job, rates, replica)
    node = (1.0 - fallback) * replica + fallback * tiers
    return Costs(
        stall_s=job.per_node_gb / job.host_copy_gbps,
        write_s=write_s,
        downtime_s={"soft": p.inprocess_restart_s + first, "node": node, "drain": write_s + node},
        loses_work={"soft": 0.0, "node": fallback, "drain": 0.0},
        async_save=True,
        interrupted_s={"node": (1.0 - fallback) * job.step_s / 2.0},
        max_interval_s=3600.0,
    )


def costs(mechanism: Mechanism, job: Job, rates: FailureRates | None = None) -> Costs:
    """Downtime and lost work per fault class, and the save's stall and write, for `mechanism` on `job`
    (`rates`: the failure rates, which the replica mechanism's fallback needs)."""
    _need(mechanism in MECHANISMS, f"mechanism {mechanism!r}: use one of {', '.join(MECHANISMS)}")
    p = job.phases
    first = p.first_step_factor * job.step_s
    write_s = job.checkpoint_gb / job.shared_gbps  # every node writes its share at once
    from_shared = job.checkpoint_gb / job.shared_gbps  # after a group restart every node reads its share
    from_peer = job.node_gb / job.peer_gbps  # the replacement reads the lost node's share from its buddy
    if mechanism == "kit-replica":
        if rates is None:
            raise PlanInputError("kit-replica: give the failure rates (its fallback depends on them)")
        return _replica_costs(job, rates, first=first, write_s=write_s, from_peer=from_peer)
    if mechanism.startswith("kit"):
        node_restore = from_shared if mechanism == "kit-no-tiers" else from_peer
        node = p.node_detect_s + p.reform_s + node_restore + first
        return Costs(
            stall_s=job.per_node_gb / job.host_copy_gbps,
            write_s=write_s,
            downtime_s={"soft": p.inprocess_restart_s + first, "node": node, "drain": write_s + node},
            loses_work={"soft": 0.0, "node": 1.0, "drain": 0.0},
            async_save=True,
        )
    restart = p.ft_launcher_restart_s if mechanism == "ft_launcher" else p.kubernetes_restart_s
    again = restart + from_shared + first
    return Costs(
        stall_s=write_s,
        write_s=write_s,
        downtime_s={"soft": again, "node": again, "drain": again},
        loses_work={"soft": 1.0, "node": 1.0, "drain": 1.0},
        async_save=False,
    )


def poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu)."""
    if k < 0:
        return 0.0
    term = total = math.exp(-mu)
    for i in range(1, k + 1):
        term *= mu / i
        total += term
    return min(1.0, total)


def spare_available(job: Job, rates: FailureRates, mechanism: Mechanism) -> float:
    """The probability a node loss finds a hot spare (0 for mechanisms without spares)."""
    if mechanism in ("kit-no-spares", "ft_launcher", "torchrun") or job.spares == 0:
        return 0.0
    mu = job.nodes * rates.node * job.phases.replacement_s / 3600.0
    return poisson_cdf(job.spares - 1, mu)


def spares_needed(job: Job, rates: FailureRates, *, target: float = 0.01) -> int:
    """The fewest spares with which a node loss finds none waiting with probability at most `target`."""
    _finite("target", target, lo=0.0, lo_open=True)
    _need(target < 1, f"target={target!r}: give a probability below 1")
    mu = job.nodes * rates.node * job.phases.replacement_s / 3600.0
    spares = 0
    while 1.0 - poisson_cdf(spares - 1, mu) > target:
        spares += 1
    return spares


def young_daly_s(stall_s: float, mtbf_s: float) -> float:
    """Young/Daly's interval between saves: sqrt(2 x cost x MTBF)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one mechanism keeps and loses on the job, per day."""

    mechanism: Mechanism
    goodput: float
    interval_s: float
    interval_steps: int
    spare_available: float
    lost_per_day_s: dict[str, float]
    """stall, downtime (detection, restart, re-form, restore), replay, waiting (for a replacement)."""
    dollars_lost_per_day: float


def evaluate(
    mechanism: Mechanism, job: Job, rates: FailureRates, *, interval_s: float | None = None
) -> Outcome:
    """The model for one mechanism (see the module docstring), at its optimal interval or at `interval_s`
    (a job's own; still never below one write, since one save runs at a time)."""
    c = costs(mechanism, job, rates)
    per_s = {cls: job.nodes * rates.of(cls) / 3600.0 for cls in FAILURE_CLASSES}
    losing = sum(per_s[cls] * c.loses_work[cls] for cls in FAILURE_CLASSES)
    mtbf = 1.0 / losing if losing > 0 else math.inf
    tau = max(young_daly_s(c.stall_s, mtbf) if math.isfinite(mtbf) else 0.0, c.write_s, job.step_s)
    if not math.isfinite(mtbf):  # nothing throws work away: save as rarely as the bound on lost work allows
        tau = max(tau, 3600.0)
    tau = max(min(tau, c.max_interval_s), c.write_s, job.step_s)  # the replica path: the durable copy hourly
    if interval_s is not None:
        _finite("interval_s", interval_s, lo=0.0, lo_open=True)
        tau = max(interval_s, c.write_s)
    spare = spare_available(job, rates, mechanism)
    waiting = (1.0 - spare) * job.phases.replacement_s
    lost: dict[str, float] = {
        "stall": 86400.0 * c.stall_s / tau,
        "downtime": 0.0,
        "replay": 0.0,
        "waiting": 0.0,
    }
    age = tau / 2.0 + (c.write_s if c.async_save else 0.0)
    fault_loss = 0.0
    cls: FailureClass
    for cls in FAILURE_CLASSES:
        down = c.downtime_s[cls]
        wait = waiting if cls == "node" else 0.0
        replay = age * c.loses_work[cls] + c.interrupted_s.get(cls, 0.0)
        lost["downtime"] += 86400.0 * per_s[cls] * down
        lost["waiting"] += 86400.0 * per_s[cls] * wait
        lost["replay"] += 86400.0 * per_s[cls] * replay
        fault_loss += per_s[cls] * (down + wait + replay)
    goodput = max(0.0, (1.0 - c.stall_s / tau) * (1.0 - fault_loss))
    return Outcome(
        mechanism=mechanism,
        goodput=goodput,
        interval_s=tau,
        interval_steps=max(1, round(tau / job.step_s)),
        spare_available=spare,
        lost_per_day_s=lost,
        dollars_lost_per_day=(1.0 - goodput) * job.nodes * job.price_per_node_hour * 24.0,
    )
