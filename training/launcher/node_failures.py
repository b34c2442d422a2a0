"""A node that keeps failing by itself is given up, so that a spare or the replacement pod takes its place.

Its own failures are a local worker killed by a signal, or a hang whose culprit is a local rank (not one
waiting in a collective for a peer). Past the limit within the window the agent stops retrying, says which
node and why in one line and a `node_given_up` event, and the launcher exits without closing the rendezvous.
"""

from __future__ import annotations

import logging
from collections import deque

from fsdpkit.launcher.budget import RestartBudget
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("kit.launch")


class NodeFailures:
    """This node's own failures in a sliding window; `add` says when the node must be given up."""

    def __init__(self, *, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._times: deque[float] = deque()

    def add(self, now: float) -> int | None:
        """Record one failure; the count within the window when it reached the limit, else None."""
        self._times.append(now)
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()
        if self.limit and len(self._times) >= self.limit:
            return len(self._times)
        return None


class OwnFailures:
    """Counts this node's own failures and gives the node up past the limit (no restart left)."""

    def __init__(
        self, failures: NodeFailures, *, node_name: str, events: EventLog, budget: RestartBudget
    ) -> None:
        self.failures = failures
        self.node_name = node_name
        self.events = events
        self.budget = budget
        self.given_up: str | None = None
        """Why the node was given up (the launcher's exit line), None while it is not."""

    def count(self, now: float, reason: str) -> None:
        """One failure of this node's own; past the limit the node is given up."""
        count = self.failures.add(now)
        if count is None or self.given_up is not None:
            return
        self.given_up = (
            f"node {self.node_name} failed {count} times in {self.failures.window_s:g} s (last: {reason})"
        )
        self.budget.spend()
        log.error(
            "kit-launch: giving up node %s: %s; a spare or the Job's replacement pod takes its place "
            "(on EKS, node auto-repair replaces the instance)",
            self.node_name,
            self.given_up,
        )
        self.events.emit(
            "node_given_up",
            node=self.node_name,
            failures=count,
            window_s=self.failures.window_s,
            reason=reason,
        )
