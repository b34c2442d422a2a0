"""Elastic jobs (MIN_NODES): the global batch every node count from MIN_NODES to NODES must keep, and the
rules that refuse a job which could shrink to a size that cannot keep it exactly.

The trainer splits the global batch over the ranks it has (fsdpkit.resilience.batch) and refuses, before
any process group, a world size that does not divide it; an elastic job must therefore never shrink to
such a size. The check happens here, before the Job exists, with the node counts that work and a global
batch that keeps every count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NoReturn

from fsdpkit.contracts import defaults
from fsdpkit.contracts.global_batch import default_global_batch, world_sizes_keeping
from fsdpkit.k8s.derived import procs_per_node
from fsdpkit.k8s.model import RDZV_TIMEOUT_MAX_S, ValuesError
from fsdpkit.k8s.profiles import get_profile

if TYPE_CHECKING:
    from fsdpkit.k8s.model import JobValues


def is_elastic(v: JobValues) -> bool:
    """Whether the job may train on fewer than NODES nodes."""
    return v.min_nodes is not None and v.min_nodes < v.nodes


def micro_batch(v: JobValues) -> int:
    """Samples per rank per forward: BATCH_SIZE, else the profile's, else the trainer's default; 1 with
    ENTRYPOINT (the script's own micro-batch is unknown here: only the ranks are checked, and the script's
    plan_batch refuses, in its pods, a node count its micro-batch cannot split)."""
    if v.entrypoint:
        return 1
    return v.batch_size or get_profile(v.profile).batch_size or defaults.MICRO_BATCH


def _trained(v: JobValues, name: str, *, least: int) -> int | None:
    """TRAIN.training.<name> as a whole number of at least `least`, or None when not given. Checked here,
    before the trainer's own config check (after rendering), because the node counts are computed from it:
    12.5, true, -12 or a word are refused in one line, never rounded or acted on."""
    value = v.train.get("training", {}).get(name)
    if value is None:
        return None
    if type(value) is not int or value < least:
        _fail(f"TRAIN.training.{name}", value, f"must be a whole number, at least {least}")
    return value


def global_batch(v: JobValues) -> tuple[int | None, str]:
    """Samples per optimizer step of the job and where the number comes from; (None, why) with ENTRYPOINT
    and no TRAIN.training.global_batch (the script's micro-batch is its own)."""
    given = _trained(v, "global_batch", least=0)
    if given:
        return given, "TRAIN.training.global_batch"
    if v.entrypoint:
        return None, "ENTRYPOINT's script splits its own batch"
    accum = _trained(v, "grad_accum_steps", least=1) or 1
    product = default_global_batch(micro_batch(v), accum, v.nodes * procs_per_node(v))
    return product, "NODES x processes x BATCH_SIZE x grad_accum_steps"


def node_counts(v: JobValues) -> range:
    """Every node count the job may train on: MIN_NODES to NODES."""
    return range(v.min_nodes if v.min_nodes is not None else v.nodes, v.nodes + 1)


def keeping_counts(v: JobValues, batch: int) -> list[int]:
    """The node counts from MIN_NODES to NODES whose ranks split `batch` into whole micro-batches (the
    trainer's own rule: fsdpkit.resilience.batch)."""
    sizes = set(world_sizes_keeping(batch, micro_batch(v)))
    return [n for n in node_counts(v) if n * procs_per_node(v) in sizes]


def batch_for_every_count(v: JobValues, near: int) -> int:
    """The multiple of every count's ranks x micro-batch nearest to `near` (at least one such multiple)."""
    per_node = procs_per_node(v) * micro_batch(v)
    lcm = math.lcm(*(n * per_node for n in node_counts(v)))
    return lcm * max(1, round(near / lcm))


def _fail(key: str, value: Any, rule: str) -> NoReturn:
    raise ValuesError(f"{key}={value}: {rule}")


def check_fields(v: JobValues) -> None:
    """MIN_NODES and ELASTIC_WAIT_S on their own."""
    if v.min_nodes is not None and not 1 <= v.min_nodes <= v.nodes:
        _fail(
            "MIN_NODES",
            v.min_nodes,
            f"must be 1 to NODES={v.nodes} (the fewest nodes the job goes on with); leave it unset to train "
            "on exactly NODES",
        )
    if not 1 <= v.elastic_wait_s <= RDZV_TIMEOUT_MAX_S:
        _fail("ELASTIC_WAIT_S", v.elastic_wait_s, f"must be 1 to {RDZV_TIMEOUT_MAX_S} seconds")


def check_rules(v: JobValues) -> None:
    """An elastic job across fields: the launcher, spares, the waits, and the global batch at every size; a
    fixed job with TRAIN.training.global_batch: that NODES splits it."""
    if not is_elastic(v):
        _check_fixed_batch(v)
        return
    if v.launcher != "kit":
        _fail("MIN_NODES", v.min_nodes, f"elastic training needs LAUNCHER=kit ({v.launcher} keeps NODES)")
    if v.elastic_wait_s >= v.replacement_wait_s:
        _fail(
            "ELASTIC_WAIT_S",
            v.elastic_wait_s,
            f"must be below REPLACEMENT_WAIT_S={v.replacement_wait_s}: the survivors give up after that",
        )
    batch, source = global_batch(v)
    if batch is None:
        _fail(
            "MIN_NODES",
            v.min_nodes,
            "with ENTRYPOINT, set TRAIN.training.global_batch (samples per optimizer step): your script "
            "splits it with fsdpkit.resilience.plan_batch on whatever number of nodes is left",
        )
        return
    counts = keeping_counts(v, batch)
    missing = [n for n in node_counts(v) if n not in counts]
    if missing:
        fix = batch_for_every_count(v, batch)
        _fail(
            "MIN_NODES",
            v.min_nodes,
            f"the global batch {batch} ({source}) cannot be split exactly over {missing[0]} node(s) of "
            f"{procs_per_node(v)} process(es) x {micro_batch(v)} samples (node counts from MIN_NODES to "
            f"NODES that can: {', '.join(map(str, counts)) or 'none'}): set TRAIN.training.global_batch="
            f"{fix} (every count from {v.min_nodes} to {v.nodes}), or raise MIN_NODES",
        )


def _check_fixed_batch(v: JobValues) -> None:
    """TRAIN.training.global_batch on a job of exactly NODES: refused at render time when NODES cannot split
    it (the trainer would refuse it in every pod)."""
    given = _trained(v, "global_batch", least=0)
    if not given or v.entrypoint or keeping_counts(v, given):
        return
    ranks = v.nodes * procs_per_node(v)
    _fail(
        "TRAIN.training.global_batch",
        given,
        f"cannot be split exactly over {v.nodes} node(s) x {procs_per_node(v)} process(es) x "
        f"{micro_batch(v)} samples: use a multiple of {ranks * micro_batch(v)}",
    )


def trainer_training(v: JobValues, training: dict[str, Any]) -> None:
    """The rendered config's `training` section of an elastic job: the global batch, not the accumulation
    (the trainer derives it from the ranks it has)."""
    if not is_elastic(v):
        return
    batch, _ = global_batch(v)
    training["global_batch"] = batch
    training.pop("grad_accum_steps", None)


def nnodes(v: JobValues) -> str:
    """The launcher's --nnodes: MIN:MAX for an elastic job, else NODES."""
    return f"{v.min_nodes}:{v.nodes}" if is_elastic(v) else str(v.nodes)
