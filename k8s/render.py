"""Render the Job's manifests from a JobSpec with Jinja2 (StrictUndefined): templates only place values.

Two filters do the placing: `json` for one scalar (a JSON string is a valid YAML scalar) and `toyaml(n)` for
a block, indented to column n (Helm's `toYaml | nindent`). Which objects exist is decided here, not in
templates: the FSx PV/PVC only when CDK did not create a claim, the node-cordon ClusterRole, binding and
admission policy only when a straggler's node agent may cordon its node. The run's token Secret is never
rendered to a file: `apply` builds it in memory (fsdpkit.k8s.security.run_token_secret).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from fsdpkit.k8s.kinds import jobset, runtime_name, trainjob
from fsdpkit.k8s.spec import JobSpec, job_spec
from fsdpkit.k8s.values import JobValues

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_OUT = Path("build") / "k8s"


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks, so the ConfigMap reads like the file."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_presenter)


def _defined(value: Any) -> Any:
    """Raise jinja2.UndefinedError for a missing value (StrictUndefined raises on str())."""
    if isinstance(value, jinja2.Undefined):
        str(value)
    return value


def _json(value: Any) -> str:
    _defined(value)
    return json.dumps(value, ensure_ascii=False)


def _toyaml(value: Any, indent: int) -> str:
    _defined(value)
    if isinstance(value, str) and "\n" in value:
        body = value if value.endswith("\n") else value + "\n"
        return " |\n" + "".join(
            " " * indent + line + "\n" if line else "\n" for line in body.splitlines()
        ).rstrip("\n")
    if not value and isinstance(value, dict | list):
        return " " + _json(value)
    text = yaml.dump(value, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=1000)
    return "\n" + "\n".join(" " * indent + line for line in text.rstrip("\n").splitlines())


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals.pop("namespace", None)  # Jinja's namespace() would stand in for a missing `namespace` value
    env.filters["json"] = _json
    env.filters["toyaml"] = _toyaml
    return env


@dataclass(frozen=True)
class Manifest:
    """One rendered file: its name (apply order by prefix), text, and parsed object."""

    filename: str
    text: str
    obj: dict[str, Any]


# (file name, template, JobSpec field that must be set for the object to exist or None)
OBJECTS: tuple[tuple[str, str, str | None], ...] = (
    ("00-namespace.yaml", "namespace.yaml.j2", None),
    ("01-node-cordon-0-policy.yaml", "node-cordon-policy.yaml.j2", "node_access"),
    ("01-node-cordon-1-policybinding.yaml", "node-cordon-policybinding.yaml.j2", "node_access"),
    ("01-node-cordon-clusterrole.yaml", "node-cordon-clusterrole.yaml.j2", "node_access"),
    ("01-node-cordon-clusterrolebinding.yaml", "node-cordon-clusterrolebinding.yaml.j2", "node_access"),
    ("01-serviceaccount.yaml", "serviceaccount.yaml.j2", None),
    ("02-fsx-pv.yaml", "fsx-pv.yaml.j2", "pv"),
    ("03-fsx-pvc.yaml", "fsx-pvc.yaml.j2", "pvc"),
    ("04-configmap.yaml", "configmap.yaml.j2", None),
    ("05-networkpolicy.yaml", "networkpolicy.yaml.j2", None),
    ("05-rdzv-service.yaml", "rdzv-service.yaml.j2", "rdzv_store"),
    ("05-rdzv-store.yaml", "rdzv-store.yaml.j2", "rdzv_store"),
    ("05-service.yaml", "service.yaml.j2", None),
    ("06-job.yaml", "job.yaml.j2", None),
)


JOB_FILE = "06-job.yaml"
STORE_FILE = "05-rdzv-store.yaml"
"""What KIND=jobset and KIND=trainjob take into their own object instead of applying alone."""
KIND_FILES = {
    "jobset": (("06-jobset.yaml", "jobset.yaml.j2"),),
    "trainjob": (
        ("06-clustertrainingruntime.yaml", "clustertrainingruntime.yaml.j2"),
        ("07-trainjob.yaml", "trainjob.yaml.j2"),
    ),
}
"""The files of each kind beyond the shared ones (apply order by prefix: the runtime before its TrainJob)."""


def _kind_manifests(env: jinja2.Environment, spec: JobSpec, manifests: list[Manifest]) -> list[Manifest]:
    """KIND=jobset/trainjob: the rendered Job and the store's Deployment move into a JobSet
    (fsdpkit.k8s.kinds), so the pods are the Job's, byte for byte; the other objects stay as they are."""
    by_file = {m.filename: m for m in manifests}
    store = by_file.get(STORE_FILE)
    js = jobset.jobset_object(
        job=by_file[JOB_FILE].obj,
        store=store.obj if store else None,
        subdomain=spec.service_name,
        suspend=spec.suspend,
    )
    if spec.kind == "jobset":
        objects = [(jobset.API_VERSION, js)]
    else:
        runtime = runtime_name(spec.job_name)
        objects = [
            (trainjob.API_VERSION, trainjob.runtime_object(name=runtime, labels=spec.labels, jobset=js)),
            (trainjob.API_VERSION, trainjob.trainjob_object(jobset=js, runtime=runtime)),
        ]
    kept = [m for m in manifests if m.filename not in (JOB_FILE, STORE_FILE)]
    for (filename, template), (api, obj) in zip(KIND_FILES[spec.kind], objects, strict=True):
        text = env.get_template(template).render(api_version=api, obj=obj)
        kept.append(Manifest(filename, text, yaml.safe_load(text)))
    return kept


def render_spec(spec: JobSpec) -> list[Manifest]:
    env = environment()
    context = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    manifests = []
    for filename, template, needs in OBJECTS:
        if needs is not None and context[needs] is None:
            continue
        text = env.get_template(template).render(**context)
        manifests.append(Manifest(filename, text, yaml.safe_load(text)))
    return manifests if spec.kind == "job" else _kind_manifests(env, spec, manifests)


def render(values: JobValues) -> list[Manifest]:
    """Manifests for validated values, in apply order."""
    return render_spec(job_spec(values))


def write(manifests: list[Manifest], out_dir: Path) -> list[Path]:
    """Write the manifests into `out_dir` (its old *.yaml files are removed first, so the folder is exact)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.yaml"):
        old.unlink()
    paths = []
    for m in manifests:
        path = out_dir / m.filename
        path.write_text(m.text, encoding="utf-8")
        paths.append(path)
    return paths
