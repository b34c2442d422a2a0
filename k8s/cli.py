"""`python -m k8s render|apply|status|delete|local|docs`: the training Job from values to a running job.

Values come as KEY=VALUE pairs (`NODES=4 MODEL=llama3.1-8b`, as `make train-job` passes them) and/or flags
(`--nodes 4`); flags win. `OUTPUTS=<file>` (default cdk-outputs.json) names the stack outputs and
`DRY_RUN=1` (or `--dry-run`) stops after validation. Bad input exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from k8s import docs
from k8s.kubectl import Kubectl, KubectlError, follow
from k8s.local import LocalRunError, run_local
from k8s.outputs import OutputsError, load_stack_outputs
from k8s.render import DEFAULT_OUT, render, write
from k8s.spec import job_spec
from k8s.validate import ManifestError, validate
from k8s.values import ValuesError, apply_overrides, build_values, parse_scalar

DEFAULT_OUTPUTS = "cdk-outputs.json"
# Make variables that reach us through $(MAKEOVERRIDES) but are not job values.
_MAKE_ONLY = {"PYTHON", "CDK_ARGS", "PY", "VENV"}
_CLI_KEYS = {"OUTPUTS", "DRY_RUN", "OUT", "WORKDIR", "TIMEOUT"}
USAGE, FAILED = 2, 1


class UsageError(ValueError):
    """Bad command-line input; one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _value_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per scalar JobValues field (help from its docstring), plus --env/--set."""
    hints = typing.get_type_hints(docs.JobValues)
    field_docs = docs.field_docs(docs.JobValues)
    group = parser.add_argument_group("values (also as KEY=VALUE; flags win)")
    for f in dataclasses.fields(docs.JobValues):
        if typing.get_origin(hints[f.name]) is dict:
            continue
        group.add_argument(
            f"--{f.name.replace('_', '-')}", dest=f"v_{f.name}", metavar="V", help=field_docs.get(f.name, "")
        )
    group.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="container env")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any value key")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m k8s", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def job_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="values, e.g. NODES=4 MODEL=llama3.1-8b")
        p.add_argument("--outputs", help=f"stack outputs file (default {DEFAULT_OUTPUTS} when it exists)")
        p.add_argument("--out", type=Path, help=f"manifest folder (default {DEFAULT_OUT}/<run id>)")
        p.add_argument("--dry-run", action="store_true", help="stop after validation (DRY_RUN=1)")
        p.add_argument("--kube-version", action="append", default=[], help="extra schema version to check")
        _value_flags(p)
        return p

    job_cmd("render", "render and validate the manifests (never touches a cluster)")
    apply_p = job_cmd(
        "apply", "render, validate, kubectl apply --server-side, follow the pods and rank-0 log"
    )
    apply_p.add_argument("--no-follow", action="store_true", help="return after applying")
    local_p = job_cmd("local", "render the local profile and run its pods here as processes")
    local_p.add_argument(
        "--workdir", type=Path, default=Path("runs") / "local", help="local pod state and logs"
    )
    local_p.add_argument("--timeout", type=float, default=None, help="give up after SECONDS")
    for name, help_text in (("status", "show the run's Job and pods"), ("delete", "delete the run's Job")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="RUN_ID=<id> [NAMESPACE=<ns>]")
    ref_p = sub.add_parser(
        "image-ref", help="print <EcrRepositoryUri>:<IMAGE_TAG> from the outputs (make image)"
    )
    ref_p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="IMAGE_TAG=<tag> [OUTPUTS=<file>]")
    ref_p.add_argument("--region", action="store_true", help="print the Region output instead")
    docs_p = sub.add_parser("docs", help="rewrite the values table in docs/k8s.md")
    docs_p.add_argument("--check", action="store_true", help="fail if docs/k8s.md is stale")
    return parser


def _split_pairs(pairs: list[str]) -> tuple[list[str], dict[str, str]]:
    """Job values vs the CLI's own keys (OUTPUTS, DRY_RUN, ...); make-internal variables are dropped."""
    values, own = [], {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"{item!r} is not KEY=VALUE; e.g. NODES=4")
        upper = key.strip().upper()
        if upper in _MAKE_ONLY:
            continue
        if upper in _CLI_KEYS:
            own[upper] = value
        else:
            values.append(item)
    return values, own


def _overrides(args: argparse.Namespace, pairs: list[str]) -> list[str]:
    flags = [f"{k[2:]}={v}" for k, v in vars(args).items() if k.startswith("v_") and v is not None]
    return pairs + [f"ENV.{e}" for e in args.env] + list(args.set) + flags


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def _render_job(args: argparse.Namespace, console: Console, *, force_local: bool = False):
    pairs, own = _split_pairs(args.pairs)
    overrides = _overrides(args, pairs)
    dry_run = args.command == "render" or args.dry_run or _truthy(own.get("DRY_RUN"))
    outputs_arg = args.outputs or own.get("OUTPUTS") or None
    if force_local:
        given = apply_overrides({}, overrides).get("profile")
        if given not in (None, "local"):
            raise UsageError(f"PROFILE={given}: the local runner runs PROFILE=local only; drop PROFILE")
        overrides = ["PROFILE=local", *overrides]
    outputs = None
    path = outputs_arg or DEFAULT_OUTPUTS
    if not force_local and (outputs_arg or Path(path).is_file() or not dry_run):
        outputs = load_stack_outputs(path)
    values = build_values(outputs=outputs, overrides=overrides, allow_placeholders=dry_run or force_local)
    manifests = render(values)
    versions = [values.kubernetes_version, *args.kube_version]
    for v in args.kube_version:
        parse_scalar("kubernetes_version", v)
    validate(manifests, versions=versions, allow_placeholders=dry_run or force_local)
    out = args.out or Path(own.get("OUT") or DEFAULT_OUT / values.run_id)
    paths = write(manifests, out)
    console.print(
        f"rendered {len(paths)} manifests for run [bold]{values.run_id}[/bold] into {out}/ "
        f"(valid for Kubernetes {', '.join(versions)} + kit policy)"
    )
    if outputs is None and not force_local:
        console.print(
            "[yellow]no stack outputs: cluster values are PLACEHOLDER-... stand-ins; read the manifests, "
            "then deploy (make deploy) before applying[/yellow]"
        )
    return values, manifests, out, dry_run, own


def cmd_render(args: argparse.Namespace, console: Console) -> int:
    _render_job(args, console)
    return 0


def cmd_apply(args: argparse.Namespace, console: Console) -> int:
    values, _, out, dry_run, _own = _render_job(args, console)
    if dry_run:
        console.print(f"DRY_RUN: nothing applied. Manifests: {out}/  (apply: drop DRY_RUN)")
        return 0
    kubectl = Kubectl()
    console.print(kubectl.apply(out).rstrip())
    spec = job_spec(values)
    console.print(
        f"job {spec.job_name}: {spec.nodes} pods x {spec.procs_per_node} processes = world size "
        f"{spec.world_size}; rank 0 at {spec.rdzv_endpoint}"
    )
    if args.no_follow:
        return 0
    try:
        return follow(kubectl, namespace=values.namespace, job_name=spec.job_name, run_id=values.run_id,
                      console=console)  # fmt: skip
    except KeyboardInterrupt:
        console.print(
            f"stopped following; the Job keeps running (make train-job-status RUN_ID={values.run_id})"
        )
        return 130


def _timeout_s(raw: str | float | None) -> float | None:
    """TIMEOUT / --timeout: seconds > 0, checked before anything is rendered or started."""
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"TIMEOUT={raw!r}: must be a number of seconds > 0")
    return value


def cmd_local(args: argparse.Namespace, console: Console) -> int:
    timeout = _timeout_s(_split_pairs(args.pairs)[1].get("TIMEOUT")) or _timeout_s(args.timeout)
    values, manifests, out, _, own = _render_job(args, console, force_local=True)
    workdir = Path(own.get("WORKDIR") or args.workdir) / values.run_id
    console.print(f"running {values.nodes} local pod(s) from {out}/ (logs: {workdir}/logs)")
    result = run_local(
        manifests,
        workdir=workdir,
        timeout_s=timeout,
        on_line=lambda line: console.print(line, highlight=False, markup=False),
    )
    for pod in result.pods:
        console.print(f"pod {pod.name}: exit code {pod.exit_code} (log {pod.log})")
    if not result.succeeded:
        console.print(f"[red]local job failed[/red]: {result.reason}")
        return FAILED
    console.print(f"[green]local job completed[/green]; run folder {result.run_dir}")
    report = subprocess.run([sys.executable, "-m", "training.report", str(result.run_dir)], check=False)
    return 0 if report.returncode == 0 else FAILED


def _run_ref(args: argparse.Namespace) -> tuple[str, str | None]:
    pairs, _ = _split_pairs(args.pairs)
    merged = apply_overrides({}, pairs)
    unknown = set(merged) - {"run_id", "namespace"}
    if unknown:
        raise UsageError(
            f"{args.command} takes RUN_ID=<id> and NAMESPACE=<ns> only, not {sorted(unknown)[0].upper()}"
        )
    probe = docs.JobValues(
        run_id=merged.get("run_id") or "probe", namespace=merged.get("namespace", "kit-training")
    )
    return probe.namespace, merged.get("run_id") or None


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    namespace, run_id = _run_ref(args)
    console.print(Kubectl().status(namespace, run_id).rstrip(), highlight=False)
    return 0


def cmd_delete(args: argparse.Namespace, console: Console) -> int:
    namespace, run_id = _run_ref(args)
    if run_id is None:
        raise UsageError("delete needs RUN_ID=<id> (make train-job-status lists the runs)")
    console.print(Kubectl().delete(namespace, run_id).rstrip() or "nothing to delete", highlight=False)
    console.print(f"the run folder /fsx/runs/{run_id} and its checkpoints stay on FSx")
    return 0


def cmd_image_ref(args: argparse.Namespace, console: Console) -> int:
    pairs, own = _split_pairs(args.pairs)
    merged = apply_overrides({}, pairs)
    extra = sorted(set(merged) - {"image_tag"})
    if extra:
        raise UsageError(f"image-ref takes IMAGE_TAG=<tag> and OUTPUTS=<file> only, not {extra[0].upper()}")
    tag = merged.get("image_tag", "latest")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise UsageError(f"IMAGE_TAG={tag}: a Docker tag is letters, digits, '_', '.', '-' (at most 128)")
    outputs = load_stack_outputs(own.get("OUTPUTS") or DEFAULT_OUTPUTS)
    print(outputs["Region"] if args.region else f"{outputs['EcrRepositoryUri']}:{tag}")
    return 0


def cmd_docs(args: argparse.Namespace, console: Console) -> int:
    text = docs.DOC_PATH.read_text(encoding="utf-8")
    fresh = docs.render_doc(text)
    if args.check:
        if fresh != text:
            raise UsageError(f"{docs.DOC_PATH} is stale; run python -m k8s docs")
        return 0
    docs.DOC_PATH.write_text(fresh, encoding="utf-8")
    console.print(f"wrote {docs.DOC_PATH}")
    return 0


COMMANDS = {
    "render": cmd_render,
    "apply": cmd_apply,
    "local": cmd_local,
    "status": cmd_status,
    "delete": cmd_delete,
    "docs": cmd_docs,
    "image-ref": cmd_image_ref,
}


def main(argv: list[str] | None = None) -> int:
    console = Console(highlight=False, soft_wrap=True)
    try:
        args, extra = build_parser().parse_known_args(argv)
        if extra:
            raise UsageError(
                f"unrecognized arguments: {' '.join(extra)} (see python -m k8s {args.command} --help)"
            )
        return COMMANDS[args.command](args, console)
    except ManifestError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return FAILED
    except (UsageError, ValuesError, OutputsError, LocalRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE
    except (KubectlError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    except ValueError as exc:  # e.g. an unsupported schema version
        print(f"error: {exc}", file=sys.stderr)
        return USAGE
