"""Cost report: Cost Explorer injected through moto's documented endpoint, Pricing from a recorded
response served at the HTTP boundary, fault cost from a run folder written with fsdpkit.runtime.events."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ops_fakeaws import LocalAws, Response, Rule
from ops_world import KIT, PREFIX, World, tags_list

from fsdpkit.ops.cost_report import main

FIXTURES = Path(__file__).parent / "fixtures"
CE_PATH = "/moto-api/static/ce/cost-and-usage-results"


def ce_result(days: list[tuple[str, dict[str, float]]], token: str | None = None) -> dict:
    by_time = [
        {
            "TimePeriod": {"Start": d, "End": d},
            "Estimated": False,
            "Total": {},
            "Groups": [
                {"Keys": [k], "Metrics": {"UnblendedCost": {"Amount": str(v), "Unit": "USD"}}}
                for k, v in groups.items()
            ],
        }
        for d, groups in days
    ]
    out: dict = {"ResultsByTime": by_time, "GroupDefinitions": [], "DimensionValueAttributes": []}
    if token:
        out["NextPageToken"] = token
    return out


def inject_ce(aws: LocalAws, *results: dict) -> None:
    assert aws.post_moto_api(CE_PATH, {"results": list(results)}) == 201


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["--prefix", PREFIX, "--format", "json", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else {"stderr": out.err})


def test_spend_by_service_and_stack_from_cost_explorer(fake_aws, capsys: pytest.CaptureFixture[str]) -> None:
    inject_ce(
        fake_aws,
        # 1. daily, grouped by kit:project (two pages: the second request carries NextPageToken)
        ce_result([("2026-11-01", {f"kit:project${PREFIX}": 100.0, "kit:project$": 7.0})], token="p2"),
        ce_result([("2026-11-02", {f"kit:project${PREFIX}": 50.5, "kit:project$Other": 3.0})]),
        # 2. the kit's cost by service, 3. by stack
        ce_result([("2026-11-01", {"Amazon Elastic Compute Cloud - Compute": 120.0, "Amazon FSx": 30.5})]),
        ce_result(
            [("2026-11-01", {f"kit:stack${PREFIX}-Cluster": 140.0, f"kit:stack${PREFIX}-Storage": 10.5})]
        ),
    )
    code, doc = run_json(capsys, "--skip", "burn", "--period", "2026-11-01:2026-11-03")
    assert code == 0, doc
    s = doc["spend"]
    assert s["total_usd"] == pytest.approx(150.5)
    assert s["untagged_usd"] == pytest.approx(7.0)
    assert s["daily_usd"] == {"2026-11-01": 100.0, "2026-11-02": 50.5}
    assert list(s["by_service_usd"]) == ["Amazon Elastic Compute Cloud - Compute", "Amazon FSx"]
    assert s["by_stack_usd"] == {f"{PREFIX}-Cluster": 140.0, f"{PREFIX}-Storage": 10.5}
    assert s["ce_requests"] == 4
    assert doc["hints"] == []
    sent = [r.params for r in fake_aws.proxy.log if r.action == "GetCostAndUsage"]
    assert sent[0]["TimePeriod"] == {"Start": "2026-11-01", "End": "2026-11-03"}
    assert sent[2]["Filter"] == {
        "Tags": {"Key": "kit:project", "Values": [PREFIX], "MatchOptions": ["EQUALS"]}
    }


def test_tag_not_activated_gives_a_clear_hint_and_no_more_requests(
    fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    inject_ce(fake_aws, ce_result([("2026-11-01", {"kit:project$": 250.0})]))
    code, doc = run_json(capsys, "--skip", "burn", "--period", "7d")
    assert code == 0
    assert doc["spend"]["total_usd"] == 0.0 and doc["spend"]["ce_requests"] == 1
    assert any("activate the tag kit:project" in h and "Cost allocation tags" in h for h in doc["hints"])


def pricing_rule(aws: LocalAws) -> Rule:
    body = (FIXTURES / "pricing_get_products_p5.json").read_bytes()
    return aws.proxy.add(
        Rule(
            "pricing",
            "GetProducts",
            lambda req, fwd: Response(200, {"Content-Type": "application/x-amz-json-1.1"}, body),
        )
    )


def seed_burn(world: World) -> None:
    world.stacks()
    ec2 = world.client("ec2")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.run_instances(
        ImageId=ami,
        InstanceType="p5.48xlarge",
        MinCount=2,
        MaxCount=2,
        SubnetId=world.ids["subnet"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags_list(KIT)}],
    )
    ec2.run_instances(ImageId=ami, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1)  # someone else's
    world.client("fsx").create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[world.ids["subnet"]],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
        Tags=tags_list(KIT),
    )


def test_burn_rate_uses_the_pricing_api_with_pinned_filters(
    world: World, fake_aws, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_burn(world)
    rule = pricing_rule(fake_aws)
    png = tmp_path / "burn.png"
    code, doc = run_json(capsys, "--skip", "spend", "--png", str(png))
    assert code == 0, doc
    items = {i["kind"]: i for i in doc["burn"]["items"]}
    assert items["instance"]["count"] == 2
    # the recorded answer (61.23) differs from the static table (55.04), so this proves the API price is used
    assert items["instance"]["usd_per_hour"] == pytest.approx(2 * 61.23)
    assert items["instance"]["source"] == "pricing-api"
    assert items["fsx"]["usd_per_hour"] == pytest.approx(1200 * 0.210 / 730)
    assert doc["burn"]["usd_per_hour"] == pytest.approx(2 * 61.23 + 1200 * 0.210 / 730)
    assert rule.hits == 1
    filters = {
        f["Field"]: f["Value"]
        for f in next(r.params for r in fake_aws.proxy.log if r.action == "GetProducts")["Filters"]
    }
    assert filters["capacitystatus"] == "Used" and filters["marketoption"] == "OnDemand"
    assert filters["instanceType"] == "p5.48xlarge" and filters["regionCode"] == "us-east-1"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_burn_rate_falls_back_to_the_dated_table_with_a_label(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_burn(world)
    # a user without pricing:GetProducts (moto has no Pricing backend at all, so the answer is injected)
    fake_aws.proxy.fail("pricing", "GetProducts", "AccessDeniedException", times=None)
    code, doc = run_json(capsys, "--skip", "spend")
    assert code == 0, doc
    inst = next(i for i in doc["burn"]["items"] if i["kind"] == "instance")
    assert inst["source"].startswith("static table") and "possibly stale" in inst["source"]
    assert inst["usd_per_hour"] == pytest.approx(2 * 55.04)


def write_run(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, *, nodes: int | None = None, spares: int = 0
) -> None:
    """Two ranks: steps 1-6 (1 s each, a 0.5 s checkpoint stall after step 4), rank 1 killed after step 6,
    resume from step 4 on attempt 1, steps 5-10, end. With `nodes`, the kit launcher's `launcher_start`
    says how many training nodes and hot spares the job had."""
    from fsdpkit.runtime.events import EventLog

    t0 = 1_700_000_000.0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    logs = [EventLog(run_dir, role="trainer", rank=r) for r in (0, 1)]
    launcher = EventLog(run_dir, role="launcher", rank=None)
    if nodes is not None:
        for node_rank in range(nodes + spares):
            launcher.emit("launcher_start", ts=t0 - 1.0, node_rank=node_rank, nodes=nodes, spares=spares)
    t = t0
    for log in logs:
        log.emit("start", ts=t, world_size=2, model="tiny", ckpt_mode="async")
    for step in range(1, 7):
        for log in logs:
            log.emit("step", ts=t + 1.0, step=step, loss=1.0, duration_s=1.0, t_start=t)
        t += 1.0
        if step == 4:
            for log in logs:
                log.emit("ckpt", ts=t + 0.5, step=4, phase="stall", duration_s=0.5)
                log.emit("ckpt", ts=t + 0.6, step=4, phase="commit", duration_s=0.1)
            t += 0.5
    logs[1].emit("fault", ts=t + 0.1, fault="kill", step=6, target_rank=1)
    launcher.emit("worker_failed", ts=t + 0.3, local_rank=1, global_rank=1, exitcode=-9, reason="signal")
    launcher.emit("restart", ts=t + 0.4, attempt=1, reason="worker_failed", remaining=2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    logs = [EventLog(run_dir, role="trainer", rank=r) for r in (0, 1)]
    t += 3.0
    for log in logs:
        log.emit("start", ts=t, world_size=2, model="tiny", ckpt_mode="async")
        log.emit("resume", ts=t + 0.5, step=4, source="shared", duration_s=0.5, fallback_from=None)
    t += 0.5
    for step in range(5, 11):
        for log in logs:
            log.emit("step", ts=t + 1.0, step=step, loss=1.0, duration_s=1.0, t_start=t)
        t += 1.0
    for log in logs:
        log.emit("end", ts=t, step=10)
        log.close()
    launcher.close()


def test_fault_and_stall_cost_from_a_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsdpkit.analysis.metrics import load_run_metrics

    run = tmp_path / "run-a"
    write_run(run, monkeypatch)
    m = load_run_metrics(run)
    price = 10.0
    code = main(
        [
            "--prefix",
            PREFIX,
            "--offline",
            "--run-dir",
            str(run),
            "--gpu-hour-price",
            str(price),
            "--format",
            "json",
        ]
    )
    assert code == 0
    f = json.loads(capsys.readouterr().out)["faults"]
    assert f["gpus"] == 2
    assert f["gpu_hours"]["stall"] == pytest.approx(2 * 0.5 / 3600)  # the one 0.5 s stall, on 2 GPUs
    assert f["usd"]["stall"] == pytest.approx(2 * 0.5 / 3600 * price)
    assert f["gpu_hours"]["total"] == pytest.approx(2 * m.wall_s / 3600)
    assert f["gpu_hours"]["rework"] == pytest.approx(
        2 * (2 - 1) * 1.0 / 3600
    )  # steps 5, 6 again; 5 in recovery
    assert f["gpu_hours"]["recovery"] == pytest.approx(2 * m.recovery_s_total / 3600)
    assert len(f["per_fault"]) == 1 and f["per_fault"][0]["kind"] == "kill"
    assert f["usd_per_fault"] == pytest.approx(f["usd"]["recovery"] + f["usd"]["rework"])
    assert f["usd_per_1000_steps"] == pytest.approx(f["usd"]["total"] / 10 * 1000)


@pytest.mark.parametrize(("nodes", "spares", "gpus_per_node"), [(2, 1, 1), (1, 2, 2), (2, 0, 1)])
def test_spares_are_billed_for_the_whole_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    nodes: int,
    spares: int,
    gpus_per_node: int,
) -> None:
    """A hot spare's node is paid while it waits: spares x GPUs per node (world / training nodes) x wall."""
    from fsdpkit.analysis.metrics import load_run_metrics

    run = tmp_path / "run-spares"
    write_run(run, monkeypatch, nodes=nodes, spares=spares)
    m = load_run_metrics(run)
    price = 10.0
    base = ["--prefix", PREFIX, "--offline", "--run-dir", str(run), "--gpu-hour-price", str(price)]
    assert main([*base, "--format", "json"]) == 0
    f = json.loads(capsys.readouterr().out)["faults"]
    spare_gh = spares * gpus_per_node * m.wall_s / 3600
    assert (f["spare_nodes"], f["gpus_per_node"]) == (spares, gpus_per_node)
    assert f["gpu_hours"]["spares"] == pytest.approx(spare_gh)
    assert f["usd"]["spares"] == pytest.approx(spare_gh * price)
    assert f["gpu_hours"]["total"] == pytest.approx(2 * m.wall_s / 3600 + spare_gh)  # spares in the total
    assert f["usd_per_1000_steps"] == pytest.approx(f["usd"]["total"] / 10 * 1000)
    assert main([*base, "--format", "csv"]) == 0
    rows = {r["item"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert float(rows["spare nodes"]["value"]) == spares
    if spares:
        assert rows["GPU-hours total"]["note"].startswith(f"2 + {spares * gpus_per_node} spare GPUs x 10 USD")
        assert f"{spares} spare node(s) x {gpus_per_node} GPUs" in rows["GPU-hours spares"]["note"]
        assert f"{gpus_per_node * price:g} USD per node-hour" in rows["GPU-hours spares"]["note"]
        assert "took over 0 of 1 fault(s)" in rows["spare nodes"]["note"]  # a rank kill: no takeover
        assert "not in this run" in rows["spare nodes"]["note"]  # the saving is not claimed
    else:
        assert rows["GPU-hours spares"]["note"] == "no hot spare" and float(rows["cost spares"]["value"]) == 0


def test_formats_and_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run-b"
    write_run(run, monkeypatch)
    base = ["--prefix", PREFIX, "--offline", "--run-dir", str(run)]
    png = tmp_path / "cost.png"
    assert main([*base, "--format", "csv", "--png", str(png)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0].keys() == {"section", "item", "value", "unit", "note"}
    per_gpu = 55.04 / 8  # static table: p5.48xlarge / 8 GPUs
    total = next(r for r in rows if r["item"] == "GPU-hours total")
    assert "static table" in total["note"] and f"{per_gpu:.4g}" in total["note"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*base, "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## faults and stalls (run)" in md and "| cost per 1,000 steps |" in md
    assert main([*base, "--format", "table"]) == 0
    assert "cost of one fault" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--period", "yesterday"], "--period 'yesterday'"),
        (["--period", "2026-02-01:2026-01-01"], "START must be before END"),
        (["--offline"], "--offline reports only a run's cost"),
        (["--offline", "--run-dir", "/nonexistent/run"], "is not a folder"),
    ],
)
def test_bad_input_is_one_line(args: list[str], words: str, subprocess_env: dict[str, str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "fsdpkit.ops.cost_report", "--prefix", PREFIX, *args],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], p.stderr
