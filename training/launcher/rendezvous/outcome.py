"""How the run ended, as the launcher that closed the rendezvous recorded it in the store (`RunOutcome`).

A closed rendezvous only says that the run is over. A pod that finds it closed (a hot spare never needed, or
the Job's replacement of a pod whose launcher spent its restart budget) must tell a run that finished from
one that failed: after a failure, exiting 0 would turn the failed index into a succeeded one and the Job
would succeed with nothing trained. So the launcher records why before it closes (`record`): finished, or
failed with its exit code and reason, under one key per run; the first record wins (`compare_set`), so a
node that leaves after it (its next round found closed) never rewrites the cause. A pod that finds the
rendezvous closed reads the record (`read`): a failure makes it exit `exitcodes.RUN_FAILED`, which the Job's
pod failure policy maps to failing the Job.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger("kit.launch")


def outcome_key(run_id: str) -> str:
    """The record's key: under the kit rendezvous' prefix (store_link.Keys), on either backend's store."""
    return f"kit-rdzv/{run_id}/outcome"


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """Why the rendezvous was closed: the run finished, or a launcher failed (its exit code and reason)."""

    finished: bool
    code: int
    """The closing launcher's exit code (0 when finished)."""
    reason: str
    """Its one-line reason, as it logged it."""
    closed_by: str
    """Which launcher closed it: `node R` and its pod's name when it has one."""

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> RunOutcome | None:
        """The record, or None when `text` is not one (then the closed rendezvous means what torch's does:
        the run is over)."""
        try:
            data: Any = json.loads(text)
            return cls(
                finished=bool(data["finished"]),
                code=int(data["code"]),
                reason=str(data["reason"]),
                closed_by=str(data["closed_by"]),
            )
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """'node 1 (pod x-1) exited 75: restart budget exhausted ...' for one line."""
        return f"{self.closed_by} exited {self.code}: {self.reason}"


class OutcomeStore(Protocol):
    """What `record` and `read` need of a store: torch's Store (TCPStore) or the kit's StoreLink."""

    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...


def record(store: OutcomeStore, run_id: str, outcome: RunOutcome) -> RunOutcome:
    """Write `outcome` unless a launcher recorded one already; returns the record that stands (the first)."""
    stood = bytes(store.compare_set(outcome_key(run_id), "", outcome.to_text())).decode()
    return RunOutcome.from_text(stood) or outcome


def read(store: OutcomeStore, run_id: str) -> RunOutcome | None:
    """The recorded outcome, or None when no launcher recorded one."""
    key = outcome_key(run_id)
    if not store.check([key]):  # TCPStore's get would block on a missing key
        return None
    return RunOutcome.from_text(bytes(store.get(key)).decode())


@runtime_checkable
class RecordsOutcome(Protocol):
    """A rendezvous handler that keeps the run's outcome beside its closed flag (the kit's and the c10d
    adapter; torch's static rendezvous has no place for one, and its pods never find a closed round)."""

    def record_outcome(self, outcome: RunOutcome) -> RunOutcome | None:
        """Record `outcome` (the first record wins); the record that stands, None if the store is gone."""
        ...

    def recorded_outcome(self) -> RunOutcome | None:
        """The run's recorded outcome; None when there is none or the store cannot be read."""
        ...
