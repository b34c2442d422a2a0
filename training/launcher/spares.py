"""Hot spares on torchelastic's dynamic rendezvous (reference/node-loss.md).

With `--nnodes N:N` and more than N agents, the agents that arrive once a round is complete wait in its
redundancy list: warm (launcher, zygote with torch imported), keeping alive, no worker started, no join
timeout. When a participant is lost the rendezvous moves one of them to the wait list and the next round
forms with it at once, so the world size never changes. The kit adds two things:

- a spare by index (a pod whose --node-rank is >= NNODES) joins only after the first round is complete,
  so the first N pods train and "node 0" in a fault spec is a training pod, not a spare;
- a spare that is never needed sees the rendezvous closed (`RendezvousGracefulExitError`; agent.run()
  then returns None) and exits 0, so the Indexed Job completes.

It also builds the c10d handler itself (`c10d_handler`): torch parses `keep_alive_interval` as whole
seconds, and an agent writes its keep-alive only when the last one is at least an interval old, so a
timer of 1 s beats about every 2 s; under load a 2-3 s expiry then drops live nodes and every group
restarts again and again. Half a second (beats about every second, every 0.5 s while waiting) times 4
(2 s expiry) detects a silently dead node in 2 s and keeps a margin of 1 s.

One gap in torch is closed (`SpareJoinOp`): a node that put itself on the wait list while the old round
was emptying, and found the new round complete without it, stays on the wait list for good; every
healthy agent then sees a node waiting and restarts its group, the next round again leaves one node
waiting, and the job restarts in a loop. Such a node now moves to the redundancy list: a spare.

torch also polls the rendezvous state once a second while a node waits (a hard-coded 1 s sleep), so each
membership step of a re-forming round (leave, move off the redundancy list, join, complete) costs up to a
second; the kit polls every RDZV_POLL_S instead (`install_join_fix`), a few small reads a second per node.

`first_round_complete`, the join op and the poll use torch's private rendezvous internals (torch is
pinned; style.md §5).
"""

from __future__ import annotations

import time
from datetime import timedelta

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

POLL_S = 0.2
RDZV_POLL_S = 0.2
"""Seconds between rendezvous state reads while a node waits (torch: 1)."""


class SpareJoinOp(dynamic_rendezvous._RendezvousJoinOp):
    """torch's join, except that a waiting node facing a complete, full round leaves the wait list (it then
    joins the redundancy list on the next pass, as a node that arrives late does)."""

    def __call__(self, ctx, deadline):  # type: ignore[no-untyped-def]
        state = ctx.state
        if (
            not state.closed
            and state.complete
            and ctx.node in state.wait_list
            and len(state.participants) >= ctx.settings.max_nodes
        ):
            return dynamic_rendezvous._Action.REMOVE_FROM_WAIT_LIST
        return super().__call__(ctx, deadline)


def _poll_delay(seconds: float | tuple[float, float]) -> None:
    """torch's `_delay`, with its 1 s state poll shortened to RDZV_POLL_S (its random skews are kept)."""
    _torch_delay(RDZV_POLL_S if seconds == 1 else seconds)


_torch_delay = dynamic_rendezvous._delay


def install_join_fix() -> None:
    """Make torch's rendezvous use SpareJoinOp and the shorter poll (it names both from its module)."""
    dynamic_rendezvous._RendezvousJoinOp = SpareJoinOp  # type: ignore[misc]
    dynamic_rendezvous._delay = _poll_delay  # type: ignore[assignment]


def c10d_handler(params: RendezvousParameters, *, keep_alive_s: float, attempts: int) -> RendezvousHandler:
    """torch's c10d dynamic rendezvous handler with a keep-alive in fractions of a second."""
    install_join_fix()
    backend, store = create_backend(params)

    def seconds(key: str, default: int) -> timedelta:
        return timedelta(seconds=params.get_as_int(f"{key}_timeout", default) or default)

    timeout = RendezvousTimeout(
        join=seconds("join", 600), last_call=seconds("last_call", 30), close=seconds("close", 30)
    )
    return DynamicRendezvousHandler.from_backend(
        params.run_id,
        store,
        backend,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        timeout,
        keep_alive_interval=keep_alive_s,  # type: ignore[arg-type]  # used as timedelta(seconds=...)
        keep_alive_max_attempt=attempts,
    )


def is_spare(node_rank: int, nodes: int) -> bool:
    return node_rank >= nodes


def first_round_complete(handler: RendezvousHandler) -> bool:
    """Whether the rendezvous has completed a round (or was closed) yet."""
    holder = handler._state_holder  # type: ignore[attr-defined]
    holder.sync()
    state = holder.state
    return bool(state.complete or state.round > 0 or state.closed)


def wait_for_first_round(handler: RendezvousHandler, timeout_s: float) -> bool:
    """Block until the training nodes formed their first round; False after `timeout_s` (then join anyway)."""
    deadline = time.monotonic() + timeout_s
    while not first_round_complete(handler):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True
