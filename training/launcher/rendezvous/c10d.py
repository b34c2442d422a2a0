"""The c10d backend (`--rdzv-backend=c10d`): torch's dynamic rendezvous with the kit's hot spares
(reference/node-loss.md).

With `--nnodes N:N` and more than N agents, the agents that arrive once a round is complete wait in its
redundancy list: warm (launcher, zygote with torch imported), keeping alive, no worker started, no join
timeout. When a participant is lost the rendezvous moves one of them to the wait list and the next round
forms with it at once, so the world size never changes. The kit adds two things:

- a spare by index (a pod whose --node-rank is >= NNODES) joins only after the first round is complete,
  so the first N pods train and "node 0" in a fault spec is a training pod, not a spare;
- a spare that is never needed sees the rendezvous closed (`RendezvousGracefulExitError`; agent.run()
  then returns None) and exits 0 when the run finished, so the Indexed Job completes; after a failure it
  exits RUN_FAILED (the closer's record beside the state: `outcome.py`).

It also builds the c10d handler itself (`c10d_handler`), because torch parses `keep_alive_interval` as
whole seconds, and tunes what bounds the detection of a silently dead node: the keep-alive expiry,
interval x max_attempt, after the node's last beat (then the next state read drops it). A training node
beats from a timer every interval (plus the write's own time); a node that waits (a spare in the
redundancy list, a node in a re-forming round) beats from its state poll, and torch's test writes a beat
only when the last one is a whole interval old, so at 0.5 s on the 0.2 s poll a spare beats every 0.6 s.
The kit's test (`_should_keep_alive`) makes a beat due at BEAT_DUE (half) of an interval, so every node
beats about once an interval whether it trains or waits. The launcher's default, 0.25 s x 5 = 1.25 s,
drops a dead node within 1.25 s and still lets a live node's keep-alive stall for (5 - 1) x 0.25 = 1 s
(healthy processes were seen stalled 0.6-0.75 s on a busy 2-core machine; a false expiry restarts the
group onto a spare). Each beat is a compare-and-set of the whole state: 4 writes a
second per node, 256 a second for 64 nodes (docs/launcher.md).

One gap in torch is closed (`SpareJoinOp`): a node that put itself on the wait list while the old round
was emptying, and found the new round complete without it, stays on the wait list for good; every
healthy agent then sees a node waiting and restarts its group, the next round again leaves one node
waiting, and the job restarts in a loop. Here such a node moves to the redundancy list: a spare.

torch also polls the rendezvous state once a second while a node waits (a hard-coded 1 s sleep) and
reuses a state it read for 1 s, so each membership step of a re-forming round (the dead node's expiry,
a spare moving off the redundancy list, a join, the round complete) is seen up to a second late; the
kit polls every RDZV_POLL_S (`install_join_fix`) and, while a node forms a round, rereads the state at
each poll (`C10dSparesHandler`): a few small reads a second per waiting node.

Every rendezvous step also names its method for an event through `inspect.stack()`, which reads the
source of every frame (~6 ms a call on a busy machine, several per poll and per keep-alive, under the
launcher's GIL): measured, a waiting spare's launcher uses 13 % of a core and beats only every ~0.5 s,
with gaps up to 14 s under load. The kit looks the frame up instead (`_method_name`).

Rank 0 of a round picks the workers' MASTER_PORT (the kit runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
through torch's `get_free_port`, which checks only that port; the kit checks the two after it too
(`fsdpkit.contracts.ports`: the NVRx backend's stores live there).

Ranks are kept across rounds by `ranks.stable_ranks`, the rule the kit's own backend uses too.

`first_round_complete`, the join op, the poll, the keep-alive test and the cache use torch's private
rendezvous internals, only through training/runtime/torch_internals.py, which checks them at start-up.

torch's rendezvous state is a pickle every agent reads: anyone who can write its key runs code in every
agent. With the run's token (fsdpkit.runtime.run_token) the state lives under a key scoped by it and every
value is sealed (`SealedC10dBackend`): a state a client without the token wrote is refused before torch
decodes it, never unpickled.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from torch.distributed import Store
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous import api as rendezvous_api
from torch.distributed.elastic.rendezvous.api import RendezvousStateError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend, create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)
from typing_extensions import override

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.launcher.rendezvous import outcome
from fsdpkit.launcher.rendezvous.ranks import stable_ranks
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.run_token import RunKey, run_key

log = logging.getLogger("kit.launch")

POLL_S = 0.2
RDZV_POLL_S = 0.2
"""Seconds between rendezvous state reads while a node waits (torch: 1)."""
TRAINING_CACHE_S = 1
"""Seconds a training node's agent reuses the state it read (torch's default)."""
BEAT_DUE = 0.5
"""A keep-alive is written when the last one is this fraction of an interval old (torch: 1)."""


KIT_RANKS = "kit_ranks"
"""Attribute of torch's rendezvous state (pickled with it, so every node reads the same value in the same
compare-and-set) that holds the last complete round's node -> rank: its members, and the ranks they keep."""


def last_round_ranks(state: object) -> dict[object, int]:
    """Node -> rank of the last complete round ({} before the first)."""
    return dict(getattr(state, KIT_RANKS, None) or {})


def members_absent(ctx) -> int:  # type: ignore[no-untyped-def]
    """Members of the last complete round that are alive (keeping alive) but not yet in this round."""
    state = ctx.state
    members = last_round_ranks(state)
    return sum(1 for node in members if node in state.last_heartbeats and node not in state.participants)


def outsider_must_wait(ctx) -> bool:  # type: ignore[no-untyped-def]
    """A node that was not in the last complete round (a spare, or a new pod) takes a place in the next one
    only if its members cannot fill it: every member that is alive (still keeping alive: restarting its
    workers, or already back) counts as coming back. Only a member that is gone (its keep-alive expired:
    a lost, drained or given-up node) leaves a place to an outsider. So a rank fault restarts the group on
    the same nodes, and the nodes' memory-tier checkpoints stay where the ranks are."""
    state = ctx.state
    if state.closed or ctx.node in last_round_ranks(state) or ctx.node in state.participants:
        return False
    if state.complete and ctx.node not in state.redundancy_list:
        return False  # torch's rules: it waits for the next round (wait list or redundancy list)
    return len(state.participants) + members_absent(ctx) >= ctx.settings.max_nodes


class SpareJoinOp(internals.RendezvousJoinOp):
    """torch's join, except that:
    - a waiting node facing a complete, full round leaves the wait list (it then joins the redundancy list
      on the next pass, as a node that arrives late does);
    - a node that was not in the last complete round waits (keeping alive) while that round's live members
      can fill the next one (`outsider_must_wait`): a spare only replaces a node that is gone."""

    def __call__(self, ctx, deadline):  # type: ignore[no-untyped-def]
        state = ctx.state
        if (
            not state.closed
            and state.complete
            and ctx.node in state.wait_list
            and len(state.participants) >= ctx.settings.max_nodes
        ):
            return internals.RendezvousAction.REMOVE_FROM_WAIT_LIST
        if outsider_must_wait(ctx):
            if _should_keep_alive(ctx):
                return internals.RendezvousAction.KEEP_ALIVE
            return internals.RendezvousAction.SYNC
        return super().__call__(ctx, deadline)


class KitOpExecutor(internals.RendezvousOpExecutor):
    """torch's executor with two changes that make a round's members recognisable to the next round:
    - a completed round records its node -> rank (`KIT_RANKS`), and ranks are kept across rounds
      (`stable_ranks`);
    - a node that leaves the participants to re-join (every restart does, right before joining again)
      keeps a keep-alive entry, so for the moment between leaving and re-joining it still counts as alive
      (a node that leaves for good expires on the usual schedule)."""

    @override
    def _mark_rendezvous_complete(self) -> None:
        super()._mark_rendezvous_complete()
        state = internals.executor_state(self)
        state.participants.update(stable_ranks(last_round_ranks(state), sorted(state.participants)))
        setattr(state, KIT_RANKS, dict(state.participants))

    @override
    def _remove_from_participants(self) -> None:
        super()._remove_from_participants()
        internals.executor_state(self).last_heartbeats[internals.executor_node(self)] = datetime.now(UTC)


_rejoin = threading.local()
"""`active` is true while this thread's handler re-joins after a round it was part of (a restart)."""


def _poll_delay(seconds: float | tuple[float, float]) -> None:
    """torch's `_delay`, with its 1 s state poll shortened to RDZV_POLL_S and no join skew on a re-join.

    torch skews a node's join by a random 0-0.3 s "if this is our first run" (state.round == 0), but the
    round only advances once every participant has left it, so the first restart of every job would also
    wait a random 0-0.3 s (mean 0.15 s, most of a single-node restart's rendezvous phase). A first join
    keeps the skew; a handler that has formed a round before re-joins at once."""
    if isinstance(seconds, tuple) and getattr(_rejoin, "active", False):
        return
    _torch_delay(RDZV_POLL_S if seconds == 1 else seconds)


_torch_delay = internals.rendezvous_delay


def _should_keep_alive(ctx: internals.RendezvousContext) -> bool:
    """torch's test, with a beat due once the last one is BEAT_DUE of an interval old (torch: a whole one)."""
    last = ctx.state.last_heartbeats.get(ctx.node)
    due = ctx.settings.keep_alive_interval * BEAT_DUE
    return last is not None and last <= datetime.now(UTC) - due


def _method_name(depth: int = 2) -> str:
    """torch's `get_method_name` (the name of its caller's caller, for an event it drops unless a handler is
    set) without `inspect.stack()`, which reads the source of every frame: ~6 ms a call on a busy machine,
    several calls per rendezvous poll and per keep-alive, all holding the launcher's GIL."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


_torch_method_name = internals.rendezvous_method_name


def install_join_fix() -> None:
    """Make torch's rendezvous use SpareJoinOp, the shorter poll, the keep-alive test above, the cheap
    method name (it names all four from its module) and a MASTER_PORT with its store ports free."""
    internals.replace(rendezvous_api, "get_free_port", free_port_run)
    rendezvous = internals.dynamic_rendezvous
    internals.replace(rendezvous, "_RendezvousJoinOp", SpareJoinOp)
    internals.replace(rendezvous, "_delay", _poll_delay)
    internals.replace(rendezvous, "_should_keep_alive", _should_keep_alive)
    internals.replace(rendezvous, "get_method_name", _method_name)


class C10dSparesHandler(DynamicRendezvousHandler):
    """torch's handler, reading the shared state every RDZV_POLL_S while it forms a round (torch caches it
    for 1 s, so a waiting node sees a dead node's expiry or another node's join up to 1 s late); a node that
    trains keeps torch's 1 s cache for its membership checks (one read a second per node). A re-join
    (a restart) skips torch's first-join skew (`_poll_delay`)."""

    _formed_a_round = False
    outcome_store: outcome.OutcomeStore | None = None
    """The store of the rendezvous state (`c10d_handler` sets it): the run's outcome is recorded beside it."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        internals.use_op_executor(self, KitOpExecutor)

    def record_outcome(self, ended: outcome.RunOutcome) -> outcome.RunOutcome | None:
        """Record why the run ends, before closing (outcome.py); the record that stands."""
        if self.outcome_store is None:
            return None
        try:
            return outcome.record(self.outcome_store, self.get_run_id(), ended)
        except RuntimeError as exc:  # torch's store errors (DistError) included
            log.warning("kit-launch: could not record the run's outcome in the rendezvous store: %s", exc)
            return None

    def recorded_outcome(self) -> outcome.RunOutcome | None:
        """Why the rendezvous was closed, as its closer recorded it; None when unknown."""
        if self.outcome_store is None:
            return None
        try:
            return outcome.read(self.outcome_store, self.get_run_id())
        except RuntimeError as exc:
            log.warning("kit-launch: could not read the run's outcome from the rendezvous store: %s", exc)
            return None

    def next_rendezvous(self):  # type: ignore[no-untyped-def]
        holder = internals.state_holder(self)
        internals.set_state_cache(holder, RDZV_POLL_S)
        _rejoin.active = self._formed_a_round
        try:
            info = super().next_rendezvous()
        finally:
            _rejoin.active = False
            internals.set_state_cache(holder, TRAINING_CACHE_S)
        self._formed_a_round = True
        return info


class SealedC10dBackend(C10dRendezvousBackend):
    """torch's c10d backend whose state is sealed with the run's key: written with its tag, and checked
    before torch decodes (unpickles) it. A state without the run's tag is refused (RendezvousStateError)."""

    def __init__(self, store: Store, run_id: str, key: RunKey) -> None:
        self.run_key = key
        super().__init__(store, key.scoped(f"{run_id}/", f"c10d/{run_id}").rstrip("/"))

    def _call_store(self, store_op: str, *args, **kwargs) -> object:  # type: ignore[no-untyped-def]
        if store_op == "compare_set":
            name, expected, desired = args
            sealed = self.run_key.seal(name, expected) if expected else expected
            args = (name, sealed, self.run_key.seal(name, desired))
        stored = super()._call_store(store_op, *args, **kwargs)
        if store_op not in ("get", "compare_set"):
            return stored
        value = self.run_key.open(args[0], bytes(stored).decode(errors="replace"))
        if value is None:
            raise RendezvousStateError(
                f"the rendezvous state at {args[0]} does not carry the run's token: refused, not decoded"
            )
        return value.encode()


class SealedOutcomeStore:
    """The run's outcome record on the c10d store, sealed like the state (outcome.OutcomeStore)."""

    def __init__(self, store: Store, key: RunKey) -> None:
        self.store, self.key = store, key

    def compare_set(self, name: str, expected: str, desired: str) -> bytes:
        old = self.key.seal(name, expected) if expected else expected
        stood = bytes(self.store.compare_set(name, old, self.key.seal(name, desired)))
        return (self.key.open(name, stood.decode(errors="replace")) or "").encode()

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))

    def get(self, name: str) -> bytes:
        return (self.key.open(name, bytes(self.store.get(name)).decode(errors="replace")) or "").encode()


def c10d_handler(params: RendezvousParameters, *, keep_alive_s: float, attempts: int) -> RendezvousHandler:
    """torch's c10d dynamic rendezvous handler with a keep-alive in fractions of a second; with the run's
    token, on the sealed backend."""
    install_join_fix()
    backend, store = create_backend(params)
    key = run_key()
    if key.enabled:
        backend = SealedC10dBackend(store, params.run_id, key)

    def seconds(key: str, default: int) -> timedelta:
        return timedelta(seconds=params.get_as_int(f"{key}_timeout", default) or default)

    timeout = RendezvousTimeout(
        join=seconds("join", 600), last_call=seconds("last_call", 30), close=seconds("close", 30)
    )
    handler = C10dSparesHandler.from_backend(
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
    handler.outcome_store = SealedOutcomeStore(store, key) if key.enabled else store
    return handler


def create_c10d_handler(params: RendezvousParameters) -> RendezvousHandler:
    """`c10d_handler` from the parameters alone: the config carries the keep-alive (keep_alive_interval in
    seconds, fractions allowed; keep_alive_max_attempt), with torch's defaults (5 s, 3) when absent."""
    return c10d_handler(
        params,
        keep_alive_s=float(params.get("keep_alive_interval", 5)),
        attempts=int(params.get("keep_alive_max_attempt", 3)),
    )


def first_round_complete(handler: RendezvousHandler) -> bool:
    """Whether the rendezvous has completed a round (or was closed) yet."""
    holder = internals.state_holder(handler)
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
