"""The job's data-parallel layout (config `parallel`): FSDP over every rank, or HSDP (replicas x shards).

FSDP2 shards each parameter over the ranks of one mesh dimension. On a 1-D mesh (the default, `replicate: 1`)
that is every rank of the job: each all-gather and reduce-scatter spans the cluster. HSDP is `fully_shard` on
a 2-D mesh (`replicate` x `shard`): parameters are sharded within a shard group of `shard` consecutive ranks
and the groups are replicas of each other; a step's gradients are reduce-scattered inside the group and then
all-reduced across replicas (one shard's worth per rank). With the shard group inside a node, the heavy
traffic stays on NVLink and only the gradient all-reduce crosses EFA; and every shard is held live by
`replicate` ranks, which is what recovery from a live replica uses (fsdpkit.resilience.replica).

Ranks are numbered node by node (node n holds ranks n*L..n*L+L-1 for L ranks per node), and the mesh is
row-major (rank = r * shard + s), so a shard group never splits a node's ranks across nodes unless it spans
whole nodes: `shard` must divide L or be a multiple of it. The data split does not change: every rank
still reads its own micro-batches of each global batch, so HSDP trains the same sequence of global batches
as FSDP (only the reduction order differs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from fsdpkit.contracts.cliargs import parse_int


class LayoutError(ValueError):
    """A layout that does not fit the job; the message is one line with the fix."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    replicate: int | Literal["auto"] = 1
    """Replicas of the model state (HSDP's replicate degree). 1: plain FSDP, every parameter sharded over
    every rank. N > 1: N replicas, each sharded over world size / N ranks. auto: the smallest shard group
    the memory plan fits (the kit's trainer; a script without a plan gets one node's ranks), the rest
    replicas. An elastic job whose world size changes keeps `shard` and changes the replicas: use auto."""
    shard: int | Literal["auto"] = "auto"
    """Ranks in one shard group (HSDP's shard degree): must divide the ranks per node or be a multiple of
    them, so a group never splits a node. auto: world size / replicate."""

    def __post_init__(self) -> None:
        for name in ("replicate", "shard"):
            value = getattr(self, name)
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise LayoutError(f"parallel.{name} must be an integer >= 1 or auto, got {value!r}")

    @property
    def hybrid(self) -> bool:
        """Asked for replicas (HSDP), or left it to the plan."""
        return self.replicate != 1

    def resolve(
        self, *, world_size: int, ranks_per_node: int, fits: Callable[[int], bool] | None = None
    ) -> MeshLayout:
        """The layout on this job (`resolve_layout`); LayoutError (a ValueError) with the fix."""
        return resolve_layout(self, world_size=world_size, ranks_per_node=ranks_per_node, fits=fits)


@dataclass(frozen=True)
class MeshLayout:
    """The resolved layout: `replicate` x `shard` = world size."""

    replicate: int
    shard: int

    @property
    def world_size(self) -> int:
        return self.replicate * self.shard

    def replica_of(self, rank: int) -> int:
        return rank // self.shard

    def shard_index(self, rank: int) -> int:
        return rank % self.shard

    def holders(self, shard_index: int) -> list[int]:
        """The ranks that hold shard `shard_index`, one per replica."""
        return [r * self.shard + shard_index for r in range(self.replicate)]

    def describe(self) -> str:
        if self.replicate == 1:
            return f"FSDP over {self.shard} ranks"
        return f"HSDP {self.replicate} replicas x {self.shard} ranks per shard group"


def shard_candidates(world_size: int, ranks_per_node: int) -> list[int]:
    """Shard group sizes that keep nodes whole, smallest first: divisors of the ranks per node, then
    multiples of a node, each dividing the world size."""
    inside = [s for s in range(1, ranks_per_node + 1) if ranks_per_node % s == 0]
    spanning = [ranks_per_node * k for k in range(2, world_size // max(1, ranks_per_node) + 1)]
    return [s for s in inside + spanning if world_size % s == 0]


def _check_shard(shard: int, world_size: int, ranks_per_node: int) -> None:
    if world_size % shard:
        raise LayoutError(
            f"parallel.shard={shard} does not divide the world size {world_size}: pick one of "
            f"{_listing(shard_candidates(world_size, ranks_per_node))}"
        )
    if ranks_per_node % shard and shard % ranks_per_node:
        raise LayoutError(
            f"parallel.shard={shard} would split a node's {ranks_per_node} ranks across shard groups: pick "
            f"one of {_listing(shard_candidates(world_size, ranks_per_node))}"
        )


def _listing(values: list[int]) -> str:
    return ", ".join(map(str, values)) or "(none)"


def resolve_layout(
    cfg: ParallelConfig,
    *,
    world_size: int,
    ranks_per_node: int,
    fits: Callable[[int], bool] | None = None,
) -> MeshLayout:
    """The layout `cfg` asks for on this job, or LayoutError with the fix. `fits(shard)`: whether the
    memory plan fits a shard group of that size (used by replicate=auto and shard=auto together)."""
    if world_size < 1 or ranks_per_node < 1:
        raise LayoutError(f"world size {world_size} and ranks per node {ranks_per_node} must be >= 1")
    ranks_per_node = min(ranks_per_node, world_size)
    replicate, shard = cfg.replicate, cfg.shard
    if replicate == "auto" and shard == "auto":
        shard = _auto_shard(world_size, ranks_per_node, fits)
    elif shard == "auto":
        assert replicate != "auto"
        if world_size % replicate:
            raise LayoutError(
                f"parallel.replicate={replicate} does not divide the world size {world_size}: pick a "
                f"divisor, or set parallel.replicate auto (replicas from parallel.shard)"
            )
        shard = world_size // replicate
    elif replicate != "auto" and replicate * shard != world_size:
        raise LayoutError(
            f"parallel.replicate={replicate} x parallel.shard={shard} = {replicate * shard}, but the world "
            f"size is {world_size}: set one of them to auto"
        )
    _check_shard(shard, world_size, ranks_per_node)
    return MeshLayout(world_size // shard, shard)


def _auto_shard(world_size: int, ranks_per_node: int, fits: Callable[[int], bool] | None) -> int:
    candidates = shard_candidates(world_size, ranks_per_node)
    if fits is None:  # no memory plan: shard inside a node, replicate across nodes (HSDP's usual layout)
        return ranks_per_node if ranks_per_node in candidates else world_size
    for shard in candidates:
        if fits(shard):
            return shard
    return world_size  # nothing smaller fits: plain FSDP, whose own plan then says what does not fit


def layout_from_env(
    cfg: ParallelConfig, env: Mapping[str, str], *, fits: Callable[[int], bool] | None = None
) -> MeshLayout:
    """The layout for this process's job, from the launcher's WORLD_SIZE and LOCAL_WORLD_SIZE."""
    world = parse_int(env.get("WORLD_SIZE", "1"), "WORLD_SIZE", lo=1)
    local = parse_int(env.get("LOCAL_WORLD_SIZE", str(world)), "LOCAL_WORLD_SIZE", lo=1)
    return resolve_layout(cfg, world_size=world, ranks_per_node=local, fits=fits)
