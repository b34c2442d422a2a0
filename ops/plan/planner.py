"""A kit job's plan from what the kit already knows: `cdk.json` (the node group, region, FSx), the model
shapes (the checkpoint: 12 bytes per parameter), ops/prices.json and the benchmarks' calibration. No AWS
call. `make plan` (ops/plan/__main__.py) and `make train-job`'s one-line summary both plan through here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpkit.contracts.hf_config import HfModelError, hf_shape, read_hf_config
from fsdpkit.contracts.shapes import MODEL_CONFIGS, ModelArgs
from fsdpkit.contracts.throughput import PEAK_BF16_FLOPS
from fsdpkit.infra.config import load_config
from fsdpkit.ops.cost.prices import ec2_hourly
from fsdpkit.ops.plan.calibration import ScalePhases, phase_times, read_sections, scale_phases
from fsdpkit.ops.plan.failures import FAILURE_CLASSES, LLAMA3, FailureRates, PlanInputError
from fsdpkit.ops.plan.layout import (
    EFA_NODE_GBPS,
    GPUS_PER_NODE,
    STATE_BYTES_PER_PARAM,
    Layout,
    choose,
    step_comm,
)
from fsdpkit.ops.plan.model import MECHANISMS, Job, Mechanism, Outcome, evaluate, spares_needed

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
DEFAULT_MFU = 0.4
DEFAULT_REPLACEMENT_S = 900.0


def step_seconds(params: int, *, nodes: int, batch_tokens: int, mfu: float, peak: float) -> float:
    """One optimizer step's compute at `mfu` of the peak: 6 FLOPs per parameter per token over every GPU."""
    return 6.0 * params * batch_tokens / (nodes * GPUS_PER_NODE * peak * mfu)


def layout_step(layout: Layout, shape: ModelArgs, compute_s: float) -> float:
    """A step on `layout`: its communication hides behind the compute up to the compute's length
    (ops/plan/layout.py)."""
    return max(compute_s, step_comm(layout, shape).total_s)


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What a user asks about; None: the default named beside it."""

    nodes: int | None = None
    """Training nodes (None: cdk.json gpu.max_nodes)."""
    model: str = "llama3.1-70b"
    spares: int | None = None
    """Hot spares (None: the plan's recommendation)."""
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    mfu: float = DEFAULT_MFU
    price: float | None = None
    """USD per node-hour (None: ops/prices.json for the configured instance and region)."""
    replacement_s: float = DEFAULT_REPLACEMENT_S
    rates: dict[str, float] = field(default_factory=dict)
    """Failure rates given per class (faults per node-hour); the others are Llama 3's."""
    replicate: int | str = "auto"
    """HSDP replicas (1: 1-D FSDP; `auto`: the smallest shard group whose per-GPU memory fits)."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    job: Job
    rates: FailureRates
    outcomes: list[Outcome]
    header: dict[str, Any]
    scale: ScalePhases | None
    request: PlanRequest

    def outcome(self, mechanism: Mechanism) -> Outcome:
        return next(o for o in self.outcomes if o.mechanism == mechanism)


def _context() -> dict[str, Any]:
    return json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]


def failure_rates(given: dict[str, float]) -> FailureRates:
    """Llama 3's rates with the classes the user gave replaced, and a source that says which."""
    if unknown := sorted(set(given) - set(FAILURE_CLASSES)):
        raise PlanInputError(f"failure class {unknown[0]!r}: use one of {', '.join(FAILURE_CLASSES)}")
    if not given:
        source = LLAMA3.source
    elif len(given) == len(FAILURE_CLASSES):
        source = "given"
    else:
        source = f"{LLAMA3.source}; {', '.join(given)} given"
    return FailureRates(**{cls: given.get(cls, LLAMA3.of(cls)) for cls in FAILURE_CLASSES}, source=source)


def model_shape(model: str) -> ModelArgs:
    """A kit model name's shape, or that of a Hugging Face model folder's config.json."""
    if model in MODEL_CONFIGS:
        return MODEL_CONFIGS[model]
    if not Path(model).exists() and "/" not in model:
        raise PlanInputError(
            f"model {model!r}: use one of {', '.join(sorted(MODEL_CONFIGS))} or a Hugging Face model folder"
        )
    try:
        return hf_shape(read_hf_config(model))
    except HfModelError as exc:
        raise PlanInputError(str(exc)) from None


def make_plan(req: PlanRequest) -> Plan:
    shape = model_shape(req.model)
    # The plan needs none of the Kubernetes objects' checks (they import the CDK, i.e. start node.js).
    cfg = load_config({**_context(), "kubernetes.deploy_objects": False})
    nodes = req.nodes or cfg.gpu.max_nodes
    params = shape.num_params()
    peak = PEAK_BF16_FLOPS["H100"]  # p5; p5en's H200 has the same dense bf16 peak
    rates = failure_rates(req.rates)
    price = req.price or ec2_hourly(None, cfg.gpu.instance_type, cfg.region).usd
    if price is None:
        price = ec2_hourly(None, cfg.gpu.instance_type, "us-east-1").usd
    if price is None:
        raise PlanInputError(f"no price for {cfg.gpu.instance_type} in ops/prices.json: pass --price USD")
    layout, layout_source = choose(shape, nodes, req.replicate)
    scale = scale_phases(read_sections())
    phases, sources = phase_times(nodes, scale, replacement_s=req.replacement_s)
    tib = cfg.storage.storage_gib / 1024
    shared_gbps = tib * (cfg.storage.effective_throughput_per_tib or 200) / 1000
    compute_s = step_seconds(params, nodes=nodes, batch_tokens=req.batch_tokens, mfu=req.mfu, peak=peak)
    base = Job(
        nodes=nodes,
        step_s=layout_step(layout, shape, compute_s),
        checkpoint_gb=STATE_BYTES_PER_PARAM * params / 1e9,
        shared_gbps=shared_gbps,
        price_per_node_hour=price,
        phases=phases,
        node_state_gb=layout.node_state_gb(params),
        holders=layout.holders,
        efa_gbps=EFA_NODE_GBPS,
    )
    recommended = spares_needed(base, rates)
    job = dataclasses.replace(base, spares=req.spares if req.spares is not None else recommended)
    header = {
        "nodes": nodes, "spares": job.spares, "spares_recommended": recommended,
        "model": req.model, "params": params, "checkpoint_gb": job.checkpoint_gb, "step_s": job.step_s,
        "layout": _layout_header(layout, layout_source, shape, compute_s),
        "shared_gbps": shared_gbps, "price_per_node_hour": price,
        "failure_rates_per_node_hour": dataclasses.asdict(rates),
        "phases": {k: {"s": v, "source": sources[k]} for k, v in dataclasses.asdict(phases).items()},
        "rates_gbps": {
            "shared": {"gbps": shared_gbps, "source": (
                f"cdk.json: FSx {cfg.storage.storage_gib:,} GiB at "
                f"{cfg.storage.effective_throughput_per_tib or 200} MB/s per TiB")},
            "peer": {"gbps": job.peer_gbps, "source": "p5 projection: a restore from the buddy over EFA"},
            "host_copy": {"gbps": job.host_copy_gbps,
                          "source": "p5 projection: 8 GPUs' staging to host (the save's stall)"},
            "replica": {"gbps": job.efa_gbps,
                        "source": "p5.48xlarge: 32 EFA x 100 Gbps, a replica's state to a lost node"},
        },
    }  # fmt: skip
    outcomes = [evaluate(m, job, rates) for m in MECHANISMS]
    return Plan(job=job, rates=rates, outcomes=outcomes, header=header, scale=scale, request=req)


def _layout_header(layout: Layout, source: str, shape: ModelArgs, compute_s: float) -> dict[str, Any]:
    """The layout every row assumes, its step and 1-D FSDP's on the same GPUs, and the replica path's
    transfer."""
    comm = step_comm(layout, shape)
    flat = Layout(nodes=layout.nodes, replicate=1, shard=layout.world)
    flat_step = layout_step(flat, shape, compute_s)
    step = max(compute_s, comm.total_s)
    return {
        "replicate": layout.replicate, "shard": layout.shard, "label": layout.label, "source": source,
        "holders": layout.holders, "node_state_gb": layout.node_state_gb(shape.num_params()),
        "compute_s": compute_s, "comm_s": dataclasses.asdict(comm) | {"total_s": comm.total_s},
        "fsdp_1d_step_s": flat_step, "hsdp_step_ratio": step / flat_step,
    }  # fmt: skip


GOODPUT_MARGIN = 0.005
"""A job's spares or fixed interval draw a warning when they cost more than this much expected goodput
against the plan's (half a point: at 1,024 p5 nodes, about $6,800 a day)."""


def job_summary(
    *,
    nodes: int,
    spares: int,
    model: str,
    batch_tokens: int,
    tiers: bool,
    interval: int | str,
    replicate: int | str = 1,
) -> tuple[str, list[str]]:
    """`make train-job`'s one line on the job it renders (the kit as configured: 1-D FSDP unless
    `replicate` says otherwise), and a warning where the job's spares or fixed interval cost more than
    GOODPUT_MARGIN against the plan's."""
    request = PlanRequest(
        nodes=nodes, model=model, spares=spares, batch_tokens=batch_tokens, replicate=replicate
    )
    result = make_plan(request)
    mechanism: Mechanism = "kit" if tiers else "kit-no-tiers"
    o = result.outcome(mechanism)
    recommended = result.header["spares_recommended"]
    line = (
        f"plan: expected strict goodput {o.goodput:.3f} at Llama 3's failure rates ({nodes} nodes, {spares} "
        f"spare(s), memory tiers {'on' if tiers else 'off'}); checkpoint every ~{o.interval_steps} steps "
        f"({o.interval_s:.0f} s at {result.job.step_s:.2f} s a step: compute at {DEFAULT_MFU:.0%} MFU, "
        f"communication of {result.header['layout']['label']}); "
        f"{recommended} spare(s) recommended (make plan NODES={nodes} MODEL={model} for the rest)"
    )
    notes = []
    if spares < recommended:
        better = make_plan(dataclasses.replace(result.request, spares=recommended)).outcome(mechanism)
        if better.goodput - o.goodput > GOODPUT_MARGIN:
            notes.append(
                f"SPARES={spares}: a lost node finds no spare with probability "
                f"{1 - o.spare_available:.0%} and waits for its replacement; expected goodput "
                f"{better.goodput:.3f} with SPARES={recommended} (the plan's), {o.goodput:.3f} as rendered"
            )
    if isinstance(interval, int) and interval > 0:
        own = evaluate(mechanism, result.job, result.rates, interval_s=interval * result.job.step_s)
        if o.goodput - own.goodput > GOODPUT_MARGIN:
            notes.append(
                f"CHECKPOINT_INTERVAL={interval}: expected goodput {own.goodput:.3f}, against "
                f"{o.goodput:.3f} at the plan's ~{o.interval_steps} steps; use CHECKPOINT_INTERVAL=auto "
                f"(Young/Daly from the measured save cost at run time) or ~{o.interval_steps}"
            )
    return line, notes
