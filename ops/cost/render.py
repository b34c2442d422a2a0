"""One report, five renderings: terminal table, markdown, CSV, JSON and a PNG chart (matplotlib, Agg)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fsdpkit.ops.cost.burn import Burn
from fsdpkit.ops.cost.faults import FaultCost
from fsdpkit.ops.cost.spend import Spend


@dataclass(frozen=True)
class Row:
    section: str
    item: str
    value: float | None
    unit: str
    note: str = ""


@dataclass(kw_only=True)
class CostReport:
    prefix: str
    region: str
    account: str
    spend: Spend | None = None
    burn: Burn | None = None
    faults: FaultCost | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.spend is not None:
            s, sec = self.spend, f"spend {self.spend.start}..{self.spend.end}"
            est = " (includes estimated days)" if s.estimated else ""
            rows.append(Row(sec, "total (kit:project)", s.total, "USD", est.strip()))
            rows += [Row(sec, f"service: {k}", v, "USD") for k, v in s.by_service.items()]
            rows += [Row(sec, f"stack: {k}", v, "USD") for k, v in s.by_stack.items()]
            rows.append(Row(sec, "Cost Explorer requests", float(s.requests), "requests", "$0.01 each"))
        if self.burn is not None:
            sec = "burn rate (now)"
            for i in self.burn.items:
                rows.append(
                    Row(
                        sec,
                        f"{i.kind}: {i.name} x{i.count}",
                        i.usd_per_hour,
                        "USD/h",
                        f"{i.detail}; {i.source}",
                    )
                )
            rows.append(
                Row(
                    sec,
                    "total",
                    self.burn.usd_per_hour,
                    "USD/h",
                    f"{self.burn.usd_per_hour * 24:.2f} USD/day",
                )
            )
        if self.faults is not None:
            f, sec = self.faults, "faults and stalls (run)"
            spare_gpus = f" + {f.spare_nodes * f.gpus_per_node} spare" if f.spare_nodes else ""
            note = f"{f.gpus}{spare_gpus} GPUs x {f.usd_per_gpu_hour:.4g} USD/GPU-h ({f.price_source})"
            notes = {"total": note, "spares": _spares_note(f)}
            for k in ("total", "useful", "stall", "recovery", "rework", "spares"):
                rows.append(Row(sec, f"GPU-hours {k}", f.gpu_hours[k], "GPU-h", notes.get(k, "")))
                rows.append(Row(sec, f"cost {k}", f.usd[k], "USD"))
            for world, gh in f.by_world.items():
                rows.append(Row(sec, f"GPU-hours at {world} GPUs", gh, "GPU-h", "elastic: it changed size"))
            rows.append(Row(sec, "spare nodes", float(f.spare_nodes), "nodes", _spares_saved(f)))
            rows.append(
                Row(
                    sec,
                    "cost per 1,000 steps",
                    f.usd_per_1000_steps,
                    "USD",
                    f"{f.steps_completed} steps completed",
                )
            )
            rows.append(
                Row(sec, "cost of one fault (mean)", f.usd_per_fault, "USD", f"{len(f.per_fault)} faults")
            )
            for i, pf in enumerate(f.per_fault, 1):
                rows.append(
                    Row(
                        sec,
                        f"fault {i}: {pf.kind} at step {pf.step}",
                        pf.usd,
                        "USD",
                        f"{pf.gpu_hours:.4g} GPU-h" + (f"; {pf.takeover} took over" if pf.takeover else ""),
                    )
                )
        return rows

    def hints(self) -> list[str]:
        out = list(self.notes)
        if self.spend is not None and self.spend.hint:
            out.append(self.spend.hint)
        if self.burn is not None and self.burn.unpriced:
            out.append(
                "no price for: " + ", ".join(i.name for i in self.burn.unpriced) + " (not in the Pricing "
                "API answer nor ops/prices.json); their cost is not in the total"
            )
        return out


def _spares_note(f: FaultCost) -> str:
    if not f.spare_nodes:
        return "no hot spare"
    node_usd = f.gpus_per_node * f.usd_per_gpu_hour
    return (
        f"{f.spare_nodes} spare node(s) x {f.gpus_per_node} GPUs x wall time "
        f"({node_usd:.4g} USD per node-hour)"
    )


def _spares_saved(f: FaultCost) -> str:
    """What the spares bought, said as far as one run's events can say it."""
    taken = sum(1 for pf in f.per_fault if pf.takeover == "spare")
    if not f.spare_nodes:
        return ""
    return (
        f"took over {taken} of {len(f.per_fault)} fault(s); the time they saved (Kubernetes' replacement "
        "path avoided) is not in this run: compare a run without spares"
    )


def _fmt(v: float | None) -> str:
    """Dollars and hours of very different sizes: 2 decimals from 1 up, 3 significant digits below."""
    if v is None:
        return "n/a"
    if v == 0 or abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3g}"


def to_table(report: CostReport, console: Console) -> None:
    table = Table(
        title=f"Cost report: {report.prefix} · {report.account} · {report.region}", title_justify="left"
    )
    for col in ("section", "item", "value", "unit", "note"):
        table.add_column(col, overflow="fold", justify="right" if col == "value" else "left")
    for r in report.rows():
        table.add_row(r.section, r.item, _fmt(r.value), r.unit, r.note)
    console.print(table)
    for h in report.hints():
        console.print(f"[yellow]hint:[/] {h}")


def to_markdown(report: CostReport) -> str:
    lines = [f"# Cost report: {report.prefix} (account {report.account}, {report.region})"]
    section = None
    for r in report.rows():
        if r.section != section:
            section = r.section
            lines += ["", f"## {section}", "", "| item | value | unit | note |", "|---|---:|---|---|"]
        lines.append(f"| {r.item} | {_fmt(r.value)} | {r.unit} | {r.note} |")
    for h in report.hints():
        lines += ["", f"> hint: {h}"]
    return "\n".join(lines).strip() + "\n"


def to_csv(report: CostReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "item", "value", "unit", "note"])
    for r in report.rows():
        w.writerow([r.section, r.item, "" if r.value is None else f"{r.value:.6f}", r.unit, r.note])
    return buf.getvalue()


def to_json(report: CostReport) -> str:
    doc: dict[str, Any] = {
        "prefix": report.prefix,
        "account": report.account,
        "region": report.region,
        "hints": report.hints(),
        "rows": [r.__dict__ for r in report.rows()],
    }
    if report.spend is not None:
        s = report.spend
        doc["spend"] = {
            "start": s.start.isoformat(),
            "end": s.end.isoformat(),
            "total_usd": s.total,
            "untagged_usd": s.untagged_total,
            "daily_usd": s.daily,
            "by_service_usd": s.by_service,
            "by_stack_usd": s.by_stack,
            "estimated": s.estimated,
            "ce_requests": s.requests,
        }
    if report.burn is not None:
        doc["burn"] = {
            "usd_per_hour": report.burn.usd_per_hour,
            "items": [i.__dict__ for i in report.burn.items],
        }
    if report.faults is not None:
        f = report.faults
        doc["faults"] = {
            "gpus": f.gpus,
            "usd_per_gpu_hour": f.usd_per_gpu_hour,
            "price_source": f.price_source,
            "wall_h": f.wall_h,
            "spare_nodes": f.spare_nodes,
            "gpus_per_node": f.gpus_per_node,
            "steps_completed": f.steps_completed,
            "gpu_hours": f.gpu_hours,
            "usd": f.usd,
            "usd_per_1000_steps": f.usd_per_1000_steps,
            "usd_per_fault": f.usd_per_fault,
            "per_fault": [p.__dict__ for p in f.per_fault],
            "gpu_hours_by_world": {str(k): v for k, v in f.by_world.items()},
        }
    return json.dumps(doc, indent=2)


def to_png(report: CostReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if report.spend is not None and report.spend.by_service:
        panels.append(("Spend by service (USD)", dict(report.spend.by_service)))
    elif report.spend is not None and report.spend.daily:
        panels.append(("Spend per day (USD)", dict(report.spend.daily)))
    if report.burn is not None and report.burn.items:
        panels.append(
            ("Burn rate (USD/h)", {f"{i.kind}:{i.name}": i.usd_per_hour or 0.0 for i in report.burn.items})
        )
    if report.faults is not None:
        panels.append(
            ("Run cost by bucket (USD)", {k: v for k, v in report.faults.usd.items() if k != "total"})
        )
    if not panels:
        panels.append(("No data", {}))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (title, data) in zip(axes[0], panels, strict=True):
        ax.barh(list(data.keys()), list(data.values()), color="#4C72B0")
        ax.set_title(title)
        ax.invert_yaxis()
    fig.suptitle(f"{report.prefix} · {report.account} · {report.region}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
