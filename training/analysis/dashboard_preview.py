"""`python -m fsdpkit.analysis.dashboard_preview RUN_DIR [--png PATH]`: the stacks' training dashboard,
drawn from a run's own metric records (`KIT_METRICS=file`, the local default), before any cluster exists.

The layout and the alarms are the catalog's (`DASHBOARD_ROWS`, `alarm_rules`), the ones the stacks deploy,
so what a local run shows here is what CloudWatch will show for the same job. An alarm's box says whether any
value of the run crossed its threshold: a local run is shorter than the alarm's periods, so it is a preview
of the rule, not the alarm's state.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.cliargs import OneLineParser, output_file_problem
from fsdpkit.runtime.telemetry.emf import METRICS_DIR

Series = dict[str, list[tuple[float, float, str | None]]]
"""Metric name -> (unix time, value, fault class) of every record, in time order."""
BREACHES = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


def read_series(run_dir: Path) -> Series:
    """Every metric value the run's processes wrote (each record once, whatever its dimension sets)."""
    series: Series = defaultdict(list)
    for path in sorted((run_dir / METRICS_DIR).glob("*.emf.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                meta = record["_aws"]
                names = [m["Name"] for d in meta["CloudWatchMetrics"] for m in d["Metrics"]]
                ts = meta["Timestamp"] / 1000.0
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line (the writer was killed)
            for name in names:
                if name in catalog.BY_NAME and isinstance(record.get(name), int | float):
                    series[name].append((ts, float(record[name]), record.get(catalog.FAULT_CLASS)))
    for points in series.values():
        points.sort(key=lambda p: p[0])
    return dict(series)


def breached(series: Series, rule: catalog.AlarmRule) -> bool | None:
    """Whether a value of the run crossed the rule's threshold; None when the run has no such value."""
    values = [v for _, v, _ in series.get(rule.metric.name, [])]
    if not values:
        return None
    return any(BREACHES[rule.comparison](v, rule.threshold) for v in values)


def render(series: Series, png: Path, *, title: str, thresholds: catalog.AlarmThresholds) -> Path:
    """The dashboard as a PNG: a row of alarm boxes, then the catalog's graphs four to a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = catalog.DASHBOARD_ROWS
    rules = catalog.alarm_rules(thresholds)
    t0 = min((p[0] for points in series.values() for p in points), default=0.0)
    fig = plt.figure(figsize=(16, 2.2 + 2.6 * len(rows)))
    grid = fig.add_gridspec(len(rows) + 1, 4, height_ratios=(0.45, *([1.0] * len(rows))), hspace=0.55)
    top = fig.add_subplot(grid[0, :])
    top.axis("off")
    for i, rule in enumerate(rules):
        state = breached(series, rule)
        color, word = {None: ("#d9d9d9", "no data"), False: ("#2ca02c", "OK"), True: ("#d62728", "crossed")}[
            state
        ]
        x = i / len(rules)
        top.add_patch(plt.Rectangle((x + 0.005, 0.05), 1 / len(rules) - 0.01, 0.9, color=color, alpha=0.25))
        op = {"GreaterThanThreshold": ">", "LessThanThreshold": "<", "LessThanOrEqualToThreshold": "<="}
        top.text(x + 0.5 / len(rules), 0.5, f"{rule.key}: {word}\n{rule.metric.name} {op[rule.comparison]} "
                 f"{rule.threshold:g}", ha="center", va="center", fontsize=9)  # fmt: skip
    top.set_title(f"{title}: alarms (any value of the run past the threshold)", fontsize=10, loc="left")
    thresholds_of = {rule.metric.name: rule.threshold for rule in rules}
    for r, row in enumerate(rows, start=1):
        for c, spec in enumerate(row):
            ax = fig.add_subplot(grid[r, c])
            ax.set_title(f"{spec.name} ({spec.unit}, {spec.statistic})", fontsize=9)
            ax.tick_params(labelsize=7)
            points = series.get(spec.name, [])
            if not points:
                ax.text(0.5, 0.5, "no data in this run", ha="center", va="center", fontsize=8, color="gray")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            if spec is catalog.FAULTS:
                by_class: dict[str, list[float]] = defaultdict(list)
                for ts, _value, fault_class in points:
                    by_class[fault_class or "-"].append(ts - t0)
                for name, times in sorted(by_class.items()):
                    ax.scatter(times, range(1, len(times) + 1), label=name, s=18)
                ax.legend(fontsize=7)
            else:
                ax.plot([p[0] - t0 for p in points], [p[1] for p in points], marker=".", markersize=3, lw=1)
            if spec.name in thresholds_of:
                ax.axhline(thresholds_of[spec.name], color="#d62728", ls="--", lw=0.8)
            ax.set_xlabel("seconds", fontsize=7)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m fsdpkit.analysis.dashboard_preview", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", type=Path, help="the run folder (<run.root>/<run.id>)")
    parser.add_argument("--png", type=Path, help="where to write it (default RUN_DIR/dashboard.png)")
    args = parser.parse_args(argv)
    png = args.png or args.run_dir / "dashboard.png"
    if not (args.run_dir / METRICS_DIR).is_dir():
        print(
            f"error: RUN_DIR={str(args.run_dir)!r} has no {METRICS_DIR}/ folder: the run wrote no metric "
            "records (KIT_METRICS=file writes them; agent sends them to CloudWatch instead)",
            file=sys.stderr,
        )
        return exitcodes.USAGE
    if problem := output_file_problem(png, "--png" if args.png else "RUN_DIR"):
        print(f"error: {problem}", file=sys.stderr)
        return exitcodes.USAGE
    series = read_series(args.run_dir)
    render(series, png, title=args.run_dir.name, thresholds=catalog.AlarmThresholds())
    print(f"dashboard preview: {png}")
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
