"""Print the plan and the final report (rich tables on a terminal, plain text in a pipe, or JSON)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from fsdpkit.ops.teardown.model import Scope
from fsdpkit.ops.teardown.runner import Step

STATUS_STYLE = {"deleted": "green", "gone": "green", "kept": "yellow", "failed": "red bold"}


def _header(scope: Scope) -> str:
    return (
        f"prefix {scope.prefix} · account {scope.account} · region {scope.region} · "
        f"clusters {', '.join(scope.clusters) or '-'}"
        + (f" (gone: {', '.join(scope.former_clusters)})" if scope.former_clusters else "")
        + f" · VPCs {', '.join(scope.vpcs) or '-'}"
    )


def print_plan(console: Console, scope: Scope, steps: list[Step]) -> None:
    table = Table(title=f"Teardown plan: {_header(scope)}", title_justify="left")
    for col in ("#", "kind", "resource", "action", "why"):
        table.add_column(col, overflow="fold")
    for i, step in enumerate(steps, 1):
        if step.note:
            table.add_row(str(i), step.kind.name, "-", "[red]error[/]" if step.error else "skip", step.note)
        for d in step.decisions:
            action = "[red]delete[/]" if d.action == "delete" else "[yellow]keep[/]"
            table.add_row(str(i), step.kind.name, d.resource.label, action, d.reason)
    console.print(table)


def print_results(console: Console, scope: Scope, steps: list[Step]) -> None:
    table = Table(title=f"Teardown report: {_header(scope)}", title_justify="left")
    for col in ("status", "kind", "resource", "reason", "s"):
        table.add_column(col, overflow="fold")
    counts = {"deleted": 0, "kept": 0, "failed": 0}
    for step in steps:
        if step.note:
            table.add_row("[red]failed[/]" if step.error else "skipped", step.kind.name, "-", step.note, "")
            counts["failed"] += int(step.error)
        for r in step.results:
            style = STATUS_STYLE[r.status]
            table.add_row(
                f"[{style}]{r.status}[/]", step.kind.name, r.resource.label, r.reason, f"{r.seconds:.0f}"
            )
            counts["deleted" if r.status == "gone" else r.status] += 1
    console.print(table)
    for step in steps:
        for action in step.actions:
            console.print(f"{step.kind.name}: {action}", markup=False, highlight=False)
    console.print(f"deleted {counts['deleted']}, kept {counts['kept']}, failed {counts['failed']}")


def as_json(scope: Scope, steps: list[Step], *, executed: bool, code: int) -> str:
    def step_doc(s: Step) -> dict[str, Any]:
        return {
            "kind": s.kind.name,
            "note": s.note,
            "error": s.error,
            "actions": s.actions,
            "plan": [
                {"id": d.resource.id, "name": d.resource.name, "action": d.action, "reason": d.reason}
                for d in s.decisions
            ],
            "results": [
                {"id": r.resource.id, "status": r.status, "reason": r.reason, "seconds": round(r.seconds, 3)}
                for r in s.results
            ],
        }

    return json.dumps(
        {
            "prefix": scope.prefix,
            "account": scope.account,
            "region": scope.region,
            "clusters": list(scope.clusters),
            "former_clusters": list(scope.former_clusters),
            "vpcs": list(scope.vpcs),
            "executed": executed,
            "exit_code": code,
            "steps": [step_doc(s) for s in steps],
        },
        indent=2,
    )
