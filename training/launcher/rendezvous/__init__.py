"""The launcher's rendezvous: the kit's own backend (`kit`, the default) and torch's c10d with the kit's
spares (`c10d`), both created through torch's public handler registry (`backends.create_handler`).

torchelastic's c10d rendezvous keeps one shared state (a pickle of every node) and every node's keep-alive is
a compare-and-set of all of it: the store's traffic grows as N^1.6 (bench.scale: ~1 GB/s projected at 1,088
nodes, half of the writes failing and retried). The kit's backend keeps torch's public `RendezvousHandler`
contract, torchrun's flags and the kit's hot-spare, drain and give-up behaviour, on a design where nothing
steady costs more than O(1) per node (NVRx's barrier rendezvous takes the same turn). Store traffic, N nodes,
beat interval b: N/b small writes a second in steady training plus N/b counter reads (the membership
checks); a membership change costs each node O(1) polls a second and the leader O(N) reads once, plus one
result (O(N) bytes) read by each node.

The map, bottom up:
- `settings.py`: `Settings`, what the kit's backend takes from the launcher's flags, and the limits that
  follow (the expiry, a silent node's verdict, the invite timeout).
- `store_link.py`: `StoreLink`, the node's store client that reconnects when the store restarts; `Keys`,
  one run's keys; `StoreReset`, a round to form again.
- `ranks.py`: ranks kept across rounds (`stable_ranks`, used by both backends), spares by index, the ring.
- `liveness.py`: `Beats`, this node's O(1) beat thread; `FailureDetector`, the accrual rule that judges a
  silent node by its own beat gaps and the load now.
- `rounds.py`: `Membership`, this node's view of the rounds; `Joiner` and `RoundLeader`, how a round forms.
- `spare_pool.py`: `SparePool`, where a node without a place waits to be invited.
- `kit.py`: `KitRendezvous`, the `RendezvousHandler` that composes the parts above; `create_kit_handler`,
  its creator in torch's registry.
- `c10d.py`: torch's c10d dynamic rendezvous with the kit's spares, kept ranks and shorter polls.
- `outcome.py`: `RunOutcome`, why the run's rendezvous was closed (finished, or failed with the exit code
  and reason), recorded by the launcher that closes it and read by a pod that finds it closed (both
  backends): after a failure that pod exits RUN_FAILED, never 0.
- `backends.py`: `register_backends` ("kit" in torch's registry) and `create_handler`, the launcher's one
  call.
"""

from fsdpkit.launcher.rendezvous.backends import create_handler, register_backends
from fsdpkit.launcher.rendezvous.kit import BACKEND, Joined, KitRendezvous, create_kit_handler, kit_handler
from fsdpkit.launcher.rendezvous.ranks import is_spare, stable_ranks
from fsdpkit.launcher.rendezvous.settings import Settings
from fsdpkit.launcher.rendezvous.store_link import StoreLink

__all__ = [
    "BACKEND",
    "Joined",
    "KitRendezvous",
    "Settings",
    "StoreLink",
    "create_handler",
    "create_kit_handler",
    "is_spare",
    "kit_handler",
    "register_backends",
    "stable_ranks",
]
