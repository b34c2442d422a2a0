"""`python -m fsdpkit.k8s render|apply|status|delete|local|docs`: the training Job from values to a running
job.

Values come as KEY=VALUE pairs (`NODES=4 MODEL=llama3.1-8b`, as `make train-job` passes them) and/or flags
(`--nodes 4`); each key once, in either form. `OUTPUTS=<file>` (default cdk-outputs.json) names the stack
outputs and `DRY_RUN=1` (or `--dry-run`) stops after validation. Bad input exits 2 with one line on stderr;
the trainer's own config check runs before anything is written or applied.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import secrets
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from fsdpkit.contracts.cliargs import float_arg, output_folder_problem, parse_bool, parse_float, program
from fsdpkit.k8s import docs, security
from fsdpkit.k8s.derived import procs_per_node, world_size
from fsdpkit.k8s.kubectl import KINDS, Kubectl, KubectlError, follow, missing_crd_line
from fsdpkit.k8s.local import LocalRunError, run_local
from fsdpkit.k8s.make_args import MakeLineError, check_make
from fsdpkit.k8s.model import JobValues
from fsdpkit.k8s.outputs import OutputsError, load_stack_outputs
from fsdpkit.k8s.overrides import field_names, key_label
from fsdpkit.k8s.plan_summary import plan_lines
from fsdpkit.k8s.profiles import get_profile
from fsdpkit.k8s.render import DEFAULT_OUT, render, write
from fsdpkit.k8s.rules import check_fields
from fsdpkit.k8s.spec import CONFIG_FILE, job_spec
from fsdpkit.k8s.trainer_check import check_trainer_config
from fsdpkit.k8s.validate import ManifestError, validate
from fsdpkit.k8s.values import ValuesError, advice, apply_overrides, build_values
from fsdpkit.k8s.versions import version_problem

DEFAULT_OUTPUTS = "cdk-outputs.json"
# Make variables that reach us through $(MAKEOVERRIDES) but are not job values.
_MAKE_ONLY = {"PYTHON", "CDK_ARGS", "PY", "VENV", "STAMP", "CDK"}
# The CLI's own keys, and the flag that sets the same thing (a key may come once, in either form).
_CLI_KEYS = {
    "OUTPUTS": "outputs",
    "DRY_RUN": "dry_run",
    "OUT": "out",
    "WORKDIR": "workdir",
    "TIMEOUT": "timeout",
}
# The CLI keys each command takes; any other is refused (a dropped DRY_RUN=1 on delete would delete).
_COMMAND_KEYS: dict[str, frozenset[str]] = {
    "render": frozenset({"OUTPUTS", "DRY_RUN", "OUT"}),
    "apply": frozenset({"OUTPUTS", "DRY_RUN", "OUT"}),
    "local": frozenset({"DRY_RUN", "OUT", "WORKDIR", "TIMEOUT"}),
    "status": frozenset(),
    "delete": frozenset(),
    "image-ref": frozenset({"OUTPUTS"}),
}
_NOT_TAKEN = {
    ("delete", "DRY_RUN"): "it has no dry run; make train-job-status RUN_ID=<id> shows what it would delete",
    ("local", "OUTPUTS"): "the local runner needs no stack outputs; drop it",
}
# The make target that runs each command (for messages).
_MAKE_TARGET = {
    "render": "<target>",
    "apply": "train-job",
    "local": "train-local",
    "status": "train-job-status",
    "delete": "train-job-delete",
    "image-ref": "image",
}
USAGE, FAILED = 2, 1
TIMEOUT_MAX_S = 30 * 86400.0
"""TIMEOUT / --timeout above 30 days is a typo, not a plan (and overflows some OS timers)."""
LOST_POD_REPLACE_MAX_S = 3600.0
"""A lost pod's replacement delay in `local`: EKS replaces a lost node's pod after 40-340 s."""


class UsageError(ValueError):
    """Bad command-line input; one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


class _Once(argparse.Action):
    """Store a flag's value; the same flag twice is an error (`--nodes 4 --nodes 5`: which one?)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            raise UsageError(f"{option_string} is given twice; give it once")
        setattr(namespace, self.dest, values)


def _value_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per scalar JobValues field (help from its docstring), plus --env/--set."""
    hints = typing.get_type_hints(docs.JobValues)
    field_docs = docs.field_docs(docs.JobValues)
    group = parser.add_argument_group("values (also as KEY=VALUE; flags win)")
    for f in dataclasses.fields(docs.JobValues):
        if typing.get_origin(hints[f.name]) is dict:
            continue
        group.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f"v_{f.name}",
            metavar="V",
            action=_Once,
            help=field_docs.get(f.name, ""),
        )
    group.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="container env")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any value key")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=program("python -m fsdpkit.k8s"), description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_pairs(name: str, help_text: str, pairs_help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help=pairs_help)
        p.add_argument("--make-pid", type=int, help=argparse.SUPPRESS)  # make's pid, from the Makefile
        return p

    def job_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = with_pairs(name, help_text, "values, e.g. NODES=4 MODEL=llama3.1-8b")
        p.add_argument(
            "--outputs", action=_Once, help=f"stack outputs file (default {DEFAULT_OUTPUTS} when it exists)"
        )
        p.add_argument(
            "--out", type=Path, action=_Once, help=f"manifest folder (default {DEFAULT_OUT}/<run id>)"
        )
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
        "--workdir", type=Path, action=_Once, help="local pod state and logs (default runs/local)"
    )
    local_p.add_argument(
        "--timeout",
        type=float_arg(lo=0, lo_open=True, hi=TIMEOUT_MAX_S),
        action=_Once,
        help="give up after SECONDS (above 0, at most 30 days)",
    )
    local_p.add_argument(
        "--lost-pod-replace-after",
        type=float_arg(lo=0, hi=LOST_POD_REPLACE_MAX_S),
        action=_Once,
        metavar="SECONDS",
        help="start a lost pod's replacement (the node fault) after SECONDS instead of at once, as a "
        "cluster does (0 to 3600; default 0)",
    )
    for name, help_text in (
        ("status", "show the run's Job, JobSet or TrainJob and its pods"),
        ("delete", "delete the run's Job, JobSet or TrainJob"),
    ):
        with_pairs(name, help_text, "RUN_ID=<id> [NAMESPACE=<ns>]")
    ref_p = with_pairs(
        "image-ref",
        "print <EcrRepositoryUri>:<IMAGE_TAG> from the outputs (make image)",
        "IMAGE_TAG=<tag> [OUTPUTS=<file>]",
    )
    ref_p.add_argument("--region", action="store_true", help="print the Region output instead")
    docs_p = sub.add_parser("docs", help="rewrite the values table in docs/k8s.md")
    docs_p.add_argument("--check", action="store_true", help="fail if docs/k8s.md is stale")
    return parser


def _split_pairs(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Job values vs the CLI's own keys (OUTPUTS, DRY_RUN, ...); make-internal variables are dropped.

    A CLI key given twice, or both as a pair and as its flag (`OUTPUTS=a --outputs b`), is an error; so is
    one the command does not take (`delete RUN_ID=x DRY_RUN=1` would delete), and one in the environment
    that the user may think counts (make's environment; `DRY_RUN` here).
    """
    values, own = [], {}
    for item in args.pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"{item!r} is not KEY=VALUE; e.g. NODES=4")
        upper = key.strip().upper()
        if upper in _MAKE_ONLY:
            continue
        if upper not in _CLI_KEYS:
            values.append(item)
            continue
        flag = _CLI_KEYS[upper]
        if upper in own:
            raise UsageError(f"{upper} is given twice ({upper}={own[upper]}, then {item}); give it once")
        if getattr(args, flag, None) not in (None, False):
            raise UsageError(f"{upper} is given twice (--{flag.replace('_', '-')} and {item}); give it once")
        own[upper] = value
    _check_command_takes(args, own)
    given = [item.partition("=")[0].strip() for item in args.pairs]
    if args.make_pid is not None:
        check_make(args.make_pid, known=_known_keys(), given=given, target=_MAKE_TARGET[args.command])
    elif "DRY_RUN" in os.environ and "DRY_RUN" not in own and not getattr(args, "dry_run", False):
        raise UsageError(
            f"DRY_RUN={os.environ['DRY_RUN']!r} is set in the environment, which the job CLI does not "
            "read: give DRY_RUN=1 (or --dry-run) as an argument, or unset DRY_RUN"
        )
    return values, own


def _check_command_takes(args: argparse.Namespace, own: dict[str, str]) -> None:
    """A CLI key the command does not take is an error, never ignored."""
    takes = _COMMAND_KEYS[args.command]
    for key, flag in _CLI_KEYS.items():
        if key in takes or (key not in own and getattr(args, flag, None) in (None, False)):
            continue
        given = f"{key}={own[key]}" if key in own else f"--{flag.replace('_', '-')}"
        takes_text = ", ".join(sorted(takes)) if takes else "RUN_ID=<id> and NAMESPACE=<ns> only"
        why = _NOT_TAKEN.get((args.command, key)) or f"it takes {takes_text}"
        raise UsageError(f"{args.command} does not take {given}: {why}")


@functools.cache
def _known_keys() -> frozenset[str]:
    """Every key make train-job & co. pass on: the values' and the CLI's own."""
    return frozenset({key_label(name) for name in field_names()} | set(_CLI_KEYS))


def _overrides(args: argparse.Namespace, pairs: list[str]) -> list[str]:
    flags = [f"{k[2:].upper()}={v}" for k, v in vars(args).items() if k.startswith("v_") and v is not None]
    return pairs + [f"ENV.{e}" for e in args.env] + list(args.set) + flags


def _bool(own: dict[str, str], key: str) -> bool:
    try:
        return parse_bool(own.get(key), key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _render_job(args: argparse.Namespace, console: Console, *, force_local: bool = False):
    pairs, own = _split_pairs(args)
    overrides = _overrides(args, pairs)
    dry_run = (
        _bool(own, "DRY_RUN") or args.command == "render" or args.dry_run
    )  # a bad spelling: always an error
    outputs_arg = args.outputs or own.get("OUTPUTS") or None
    for version in args.kube_version:
        if problem := version_problem(version):
            raise UsageError(f"--kube-version {version}: {problem}")
    if force_local:
        given = apply_overrides({}, overrides).get("profile")
        if given not in (None, "local"):
            raise UsageError(f"PROFILE={given}: the local runner runs PROFILE=local only; drop PROFILE")
        if given is None:
            overrides = ["PROFILE=local", *overrides]
    outputs = None
    path = outputs_arg or DEFAULT_OUTPUTS
    if not force_local and (outputs_arg or Path(path).is_file() or not dry_run):
        outputs = load_stack_outputs(path)
    values = build_values(outputs=outputs, overrides=overrides, allow_placeholders=dry_run or force_local)
    for note in advice(values):
        print(f"warning: {note}", file=sys.stderr)
    manifests = render(values)
    versions = [values.kubernetes_version, *args.kube_version]
    validate(manifests, versions=versions, allow_placeholders=dry_run or force_local)
    profile = get_profile(values.profile)
    memory = (world_size(values), procs_per_node(values), profile.gpu_memory_mib, profile.memory_gib * 1024)
    # With ENTRYPOINT the memory plan (the kit trainer's model's) is left out; the rest is checked alike.
    plan = check_trainer_config(_config_file(manifests), memory=memory, plan=not values.entrypoint)
    out = args.out or Path(own.get("OUT") or DEFAULT_OUT / values.run_id)
    if problem := output_folder_problem(out, "--out" if args.out else "OUT"):
        raise UsageError(problem)
    try:
        paths = write(manifests, out)
    except OSError as exc:
        raise UsageError(
            f"{'--out' if args.out else 'OUT'}={str(out)!r}: cannot write the manifests "
            f"({exc.strerror or exc}); pick a folder you can write"
        ) from None
    console.print(
        f"rendered {len(paths)} manifests for run [bold]{values.run_id}[/bold] into {out}/ "
        f"(valid for Kubernetes {', '.join(versions)} + kit policy)"
    )
    if plan:
        console.print(plan, markup=False)
    summary, warnings = plan_lines(values, _config_file(manifests)) if not force_local else (None, [])
    if summary:
        console.print(summary, markup=False, highlight=False)
    for note in warnings:
        print(f"warning: {note}", file=sys.stderr)
    if outputs is None and not force_local:
        console.print(
            "[yellow]no stack outputs: cluster values are PLACEHOLDER-... stand-ins; read the manifests, "
            "then deploy (make deploy) before applying[/yellow]"
        )
    return values, manifests, out, dry_run, own


def _config_file(manifests: list[Any]) -> str:
    """The trainer config exactly as the ConfigMap will hold it."""
    (data,) = [m.obj["data"] for m in manifests if m.obj.get("kind") == "ConfigMap"]
    return data[CONFIG_FILE]


def cmd_render(args: argparse.Namespace, console: Console) -> int:
    _render_job(args, console)
    return 0


def cmd_apply(args: argparse.Namespace, console: Console) -> int:
    values, _, out, dry_run, _own = _render_job(args, console)
    if dry_run:
        console.print(f"DRY_RUN: nothing applied. Manifests: {out}/  (apply: drop DRY_RUN)")
        return 0
    kind = values.kind
    kubectl = Kubectl()
    _require_crds(kubectl, kind)
    _ensure_run_token(kubectl, values, out, console)
    console.print(kubectl.apply(out).rstrip())
    spec = job_spec(values)
    name = spec.job_name  # the run id: the Job's, JobSet's and TrainJob's name alike
    noun = "job" if kind == "job" else KINDS[kind].label
    console.print(
        f"{noun} {name}: {spec.nodes} pods x {spec.procs_per_node} processes = world size "
        f"{spec.world_size}; rank 0 at {spec.rdzv_endpoint}"
    )
    if args.no_follow:
        return 0
    try:
        return follow(kubectl, namespace=values.namespace, job_name=name, run_id=values.run_id,
                      console=console, kind=kind)  # fmt: skip
    except KeyboardInterrupt:
        console.print(
            f"stopped following; the {KINDS[kind].label} keeps running "
            f"(make train-job-status RUN_ID={values.run_id})"
        )
        return 130


def _require_crds(kubectl: Kubectl, kind: str) -> None:
    """KIND=jobset/trainjob on a cluster without the controller's CRDs: one line before anything is applied
    (the namespace and token Secret included), naming how to install them."""
    crds = KINDS[kind].crds
    if crds and (problem := missing_crd_line(kind, kubectl.served_crds(crds))):
        raise KubectlError(problem)


def _ensure_run_token(kubectl: Kubectl, values: JobValues, out: Path, console: Console) -> None:
    """The run's token Secret, created once: the namespace first, then the Secret only if absent, so no pod
    starts without it and a re-apply never replaces a running job's token. It exists only in memory here
    (32 random bytes as 64 hex) and in the cluster, never in the rendered files."""
    if not security.on_cluster(values):
        return
    console.print(kubectl.apply(out / "00-namespace.yaml").rstrip())
    secret = security.run_token_secret(values, job_spec(values).labels, secrets.token_hex(32))
    name = f"secret/{secret['metadata']['name']}"
    if kubectl.create_if_absent(secret):
        console.print(f"{name} created: the run's token, mounted read-only at {security.RUN_TOKEN_PATH}")
    else:
        console.print(f"{name} kept: it exists already (a running job's token is never replaced)")


def _timeout_s(raw: str | None) -> float | None:
    """TIMEOUT=: seconds above 0 and at most 30 days, checked before anything is rendered or started."""
    if raw is None or raw == "":
        return None
    try:
        return parse_float(raw, "TIMEOUT", lo=0, lo_open=True, hi=TIMEOUT_MAX_S)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_local(args: argparse.Namespace, console: Console) -> int:
    own = _split_pairs(args)[1]
    timeout = args.timeout or _timeout_s(own.get("TIMEOUT"))
    base = own.get("WORKDIR") or args.workdir or Path("runs") / "local"
    if problem := output_folder_problem(base, "WORKDIR" if own.get("WORKDIR") else "--workdir"):
        raise UsageError(problem)
    values, manifests, out, dry_run, own = _render_job(args, console, force_local=True)
    if dry_run:
        console.print(f"DRY_RUN: nothing run. Manifests: {out}/  (run them: drop DRY_RUN)")
        return 0
    workdir = Path(own.get("WORKDIR") or args.workdir or Path("runs") / "local") / values.run_id
    console.print(f"running {values.nodes} local pod(s) from {out}/ (logs: {workdir}/logs)")
    result = run_local(
        manifests,
        workdir=workdir,
        timeout_s=timeout,
        lost_pod_replace_after_s=args.lost_pod_replace_after or 0.0,
        on_line=lambda line: console.print(line, highlight=False, markup=False),
    )
    for pod in result.pods:
        console.print(f"pod {pod.name}: exit code {pod.exit_code} (log {pod.log})")
    if not result.succeeded:
        console.print(f"[red]local job failed[/red]: {result.reason}")
        return FAILED
    console.print(f"[green]local job completed[/green]; run folder {result.run_dir}")
    report = subprocess.run(
        [sys.executable, "-m", "fsdpkit.analysis.report", str(result.run_dir)], check=False
    )
    if report.returncode != 0 and values.entrypoint:  # the job itself succeeded
        console.print("no report: ENTRYPOINT's script wrote no step events (the resilience API writes them)")
        return 0
    return 0 if report.returncode == 0 else FAILED


def _run_ref(args: argparse.Namespace) -> tuple[str, str | None]:
    pairs, _ = _split_pairs(args)
    merged = apply_overrides({}, pairs)
    unknown = set(merged) - {"run_id", "namespace"}
    if unknown:
        raise UsageError(
            f"{args.command} takes RUN_ID=<id> and NAMESPACE=<ns> only, not {sorted(unknown)[0].upper()}"
        )
    probe = docs.JobValues(
        run_id=merged.get("run_id") or "probe", namespace=merged.get("namespace", "kit-training")
    )
    check_fields(probe)
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
    pairs, own = _split_pairs(args)
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
            raise UsageError(f"{docs.DOC_PATH} is stale; run python -m fsdpkit.k8s docs")
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
                f"unrecognized arguments: {' '.join(extra)} (see python -m fsdpkit.k8s {args.command} --help)"
            )
        return COMMANDS[args.command](args, console)
    except ManifestError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return FAILED
    except (UsageError, ValuesError, OutputsError, LocalRunError, MakeLineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE
    except (KubectlError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    except ValueError as exc:  # e.g. an unsupported schema version
        print(f"error: {exc}", file=sys.stderr)
        return USAGE


def entry() -> None:
    """The `kit-job` console script."""
    sys.exit(main())
