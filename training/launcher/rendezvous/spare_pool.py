"""The spare pool: where a node that has no place in the last round waits, O(1) a poll, to be invited.

A node that is not in the last complete round, when that round is full (a hot spare, a replacement pod, a
member dropped as dead that was only late), registers in the pool once and polls its own invite key (O(1));
the round leader invites as many live pool nodes as places are free (`rounds.RoundLeader.invite`), and
another one when an invited node does not join within the invite timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fsdpkit.launcher.rendezvous.rounds import Membership
from fsdpkit.launcher.rendezvous.settings import Settings
from fsdpkit.launcher.rendezvous.store_link import Keys, StoreLink

SPARE_POLL_S = 0.1
"""Seconds between a waiting spare's checks of its invite key: in steady training, S spares cost the store
S / SPARE_POLL_S small round trips a second (64 spares: 640), and an invite waits at most this long."""
WAIT_S = 0.5
"""A spare's wait for its invite between its looks at the job's end."""


class SparePool:
    """This node's entry in the pool of spares and outsiders, and its wait there for an invite."""

    def __init__(
        self,
        link: StoreLink,
        keys: Keys,
        node: str,
        *,
        settings: Settings,
        membership: Membership,
        check_open: Callable[[], None],
    ) -> None:
        self.link = link
        self.keys = keys
        self.node = node
        self.settings = settings
        self.membership = membership
        self.check_open = check_open
        """Raises if the rendezvous is closed or this node left (asked once a second while it waits)."""
        self.index: int | None = None
        """This node's place in the pool (None: not registered)."""

    @property
    def in_pool(self) -> bool:
        return self.index is not None

    def register(self) -> None:
        if self.index is None:
            index = self.link.call("add", self.keys.pool_count, 1)
            self.link.write(self.keys.pool(index), self.node)
            self.index = index

    def forget(self) -> None:
        """A member now: a later pool entry is a new one."""
        self.index = None

    def republish(self) -> None:
        """After the store restarted: this node's entry again, under a new index."""
        if self.index is not None:
            self.index = None
            self.register()

    def wait_for_invite(self, last: int, *, wait_s: float | None = None) -> int | None:
        """Wait in the pool (no timeout: a spare waits as long as the job runs) for an invite; the round
        number it names, or None when the last round changed so that this node should look again, or when
        `wait_s` passed (the caller looks for a lost node to substitute in between)."""
        until = None if wait_s is None else time.monotonic() + wait_s
        if not (self.settings.spare and last == 0):
            self.register()
        key = self.keys.invite(self.node)
        checks = 0
        while True:
            if self.index is None and self.membership.last_round() > 0:
                self.register()  # a spare by index: the first round is complete
            if self.link.wait_for(key, WAIT_S, SPARE_POLL_S):
                value = self.link.read(key)
                self.link.call("delete_key", key)
                if value:
                    return int(value)
            checks += 1
            if until is not None and time.monotonic() >= until:
                return None
            if checks % 2 == 0:  # once a second: the job's end, or a round that no longer is full
                self.check_open()
                if self.index is not None:
                    now_last = self.membership.last_round()
                    members = self.membership.members_of(now_last) if now_last else {}
                    if not self.membership.is_outsider(now_last, members):
                        return None
