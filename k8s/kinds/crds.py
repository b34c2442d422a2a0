"""Schema validation of the JobSet, TrainJob and ClusterTrainingRuntime against their CRDs' own OpenAPI v3
schemas (vendored in fsdpkit/k8s/schemas, provenance in its README.md), strict, plus the Jobs they embed
against the Kubernetes Job schema of the target version (kubernetes-validate, as the plain Job is).

Strict means an unknown field fails: every object schema with `properties` gets additionalProperties false
unless the CRD itself says x-kubernetes-preserve-unknown-fields (what the API server would prune, the kit
refuses). CEL rules (x-kubernetes-validations) are the API server's; the kit's own checks cover what matters.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
CRD_SCHEMAS: dict[tuple[str, str], str] = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets_v1alpha2.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs_v1alpha1.json",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): (
        "trainer.kubeflow.org_clustertrainingruntimes_v1alpha1.json"
    ),
}
"""(apiVersion, kind) -> the vendored openAPIV3Schema of that CRD version."""
CRD_GROUPS = frozenset(api.split("/")[0] for api, _ in CRD_SCHEMAS)


def is_crd_object(obj: dict[str, Any]) -> bool:
    """Whether the kit validates `obj` with a vendored CRD schema (not kubernetes-validate)."""
    return str(obj.get("apiVersion", "")).split("/")[0] in CRD_GROUPS


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.Draft4Validator | None:
    """The strict validator of one CRD version, or None when the kit vendors no schema for it."""
    name = CRD_SCHEMAS.get((api_version, kind))
    if name is None:
        return None
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    return jsonschema.Draft4Validator(_strict(schema))  # OpenAPI v3.0: draft 4's boolean exclusiveMinimum


def replicated_jobs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The replicated jobs of a JobSet or of a runtime's JobSet template ([] for a TrainJob)."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "ClusterTrainingRuntime":
        spec = (spec.get("template") or {}).get("spec") or {}
    return list(spec.get("replicatedJobs") or [])


def embedded_jobs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field path, a batch/v1 Job holding that replicated job's Job spec) for Kubernetes' own schema."""
    meta = obj.get("metadata") or {}
    base = "spec.template.spec" if obj.get("kind") == "ClusterTrainingRuntime" else "spec"
    for i, rjob in enumerate(replicated_jobs(obj)):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{meta.get('name', 'x')}-{rjob.get('name', 'x')}-0"},
            "spec": copy.deepcopy((rjob.get("template") or {}).get("spec") or {}),
        }
        yield f"{base}.replicatedJobs[{i}].template", job


def crd_problems(where: str, obj: dict[str, Any], version: str) -> list[str]:
    """The CRD schema's problems, then the embedded Jobs' against Kubernetes `version` (MAJOR.MINOR)."""
    check = validator(str(obj.get("apiVersion")), str(obj.get("kind")))
    if check is None:
        return [f"{where}: no vendored schema for {obj.get('apiVersion')} {obj.get('kind')}"]
    problems = []
    for err in sorted(check.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
        path = ".".join(str(p) for p in err.absolute_path) or "<root>"
        problems.append(f"{where}: {path}: {err.message} ({obj['apiVersion']} CRD schema)")
    for path, job in embedded_jobs(obj):
        try:
            kubernetes_validate.validate(job, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            inner = ".".join(str(p) for p in exc.path) or "<root>"  # from the Job's spec: the template's
            problems.append(f"{where}: {path}.{inner}: {exc.message} (Kubernetes {version} Job)")
    return problems
