"""Check rendered manifests: Kubernetes schemas (kubernetes-validate, strict) and the kit's own policy.

Schema validation uses the JSON schemas bundled with kubernetes-validate (offline, 1.25-1.37) in strict mode,
so a misspelt field fails. The policy checks are rules the schemas cannot express: names, label and
annotation keys and label values by the Kubernetes naming rules (`fsdpkit.k8s.names`), not privileged, only
the
IPC_LOCK capability, no secrets in literal env, whole devices (requests = limits), per-pod DNS wired up
(subdomain -> headless Service, MASTER_ADDR -> pod 0), and no dry-run placeholders in what gets applied.
Every problem is one line: `<file>: <Kind>/<name>: <field path>: <what is wrong>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import kubernetes_validate

from fsdpkit.k8s import names
from fsdpkit.k8s.kinds import checks as kind_checks
from fsdpkit.k8s.kinds.crds import crd_problems, is_crd_object
from fsdpkit.k8s.model import PLACEHOLDER
from fsdpkit.k8s.render import Manifest
from fsdpkit.k8s.rules import contains_credential, looks_secret
from fsdpkit.k8s.spec import master_addr
from fsdpkit.k8s.versions import version_problem

SCHEMA_VERSIONS: tuple[str, ...] = ("1.33", "1.34", "1.35")
"""Versions the tests validate against; `make train-job` uses the cluster's own version."""

_WHOLE_DEVICES = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")
_ALLOWED_CAPS = {"IPC_LOCK"}


class ManifestError(ValueError):
    """Manifests that failed validation; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}")


def _where(m: Manifest) -> str:
    obj = m.obj or {}
    return f"{m.filename}: {obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"


def schema_problems(manifests: Iterable[Manifest], version: str) -> list[str]:
    """Strict schema validation of every manifest against Kubernetes `version` (MAJOR.MINOR)."""
    if problem := version_problem(version):
        raise ValueError(f"KUBERNETES_VERSION={version}: {problem}")
    problems = []
    for m in manifests:
        if is_crd_object(m.obj):  # JobSet, TrainJob, ClusterTrainingRuntime: their CRDs' vendored schemas
            problems.extend(crd_problems(_where(m), m.obj, version))
            continue
        try:
            kubernetes_validate.validate(m.obj, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path) or "<root>"
            problems.append(f"{_where(m)}: {path}: {exc.message} (Kubernetes {version})")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{_where(m)}: {exc.message}")
    return problems


def _walk_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def _pod_spec_problems(where: str, pod: dict[str, Any]) -> Iterator[str]:
    base = "spec.template.spec"
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            yield f"{where}: {base}.{flag}: must not be true (the pod shares the node's {flag[4:]} namespace)"
    for i, vol in enumerate(pod.get("volumes", [])):
        if "hostPath" in vol:
            yield f"{where}: {base}.volumes[{i}]: hostPath is not allowed (use an emptyDir or the FSx claim)"
    for i, c in enumerate(pod.get("containers", []) + pod.get("initContainers", [])):
        cpath = f"{base}.containers[{i}]"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            yield f"{where}: {cpath}.securityContext.privileged: must be false (EFA needs only IPC_LOCK)"
        if sc.get("allowPrivilegeEscalation", True):
            yield f"{where}: {cpath}.securityContext.allowPrivilegeEscalation: must be false"
        caps = sc.get("capabilities") or {}
        extra = sorted(set(caps.get("add", [])) - _ALLOWED_CAPS)
        if extra:
            yield f"{where}: {cpath}.securityContext.capabilities.add: {extra} not allowed; only IPC_LOCK"
        if "ALL" not in caps.get("drop", []):
            yield f"{where}: {cpath}.securityContext.capabilities.drop: must contain ALL"
        for j, e in enumerate(c.get("env", [])):
            if "value" in e and looks_secret(e["name"], str(e["value"])):
                yield (
                    f"{where}: {cpath}.env[{j}] ({e['name']}): looks like a secret in plain text; "
                    "use valueFrom.secretKeyRef"
                )
        res = c.get("resources") or {}
        requests, limits = res.get("requests", {}), res.get("limits", {})
        for name in sorted(set(requests) | set(limits)):
            if (name in _WHOLE_DEVICES or name.startswith("hugepages-")) and requests.get(name) != limits.get(
                name
            ):
                yield (
                    f"{where}: {cpath}.resources: {name} requests ({requests.get(name)}) must equal limits "
                    f"({limits.get(name)})"
                )


def _job_problems(
    where: str, job: dict[str, Any], services: dict[tuple[str, str], dict[str, Any]]
) -> Iterator[str]:
    spec = job.get("spec", {})
    meta = job.get("metadata", {})
    name, ns = meta.get("name", ""), meta.get("namespace", "default")
    if problem := names.dns1123_label(name):
        yield f"{where}: metadata.name: {name!r} {problem} (it becomes the pods' hostnames)"
    if spec.get("completionMode") != "Indexed":
        yield f"{where}: spec.completionMode: must be Indexed (the completion index is the node rank)"
    if spec.get("completions") != spec.get("parallelism"):
        yield f"{where}: spec.parallelism: must equal completions (all nodes run together)"
    pod = spec.get("template", {}).get("spec", {})
    if pod.get("restartPolicy") != "Never":
        yield f"{where}: spec.template.spec.restartPolicy: must be Never (the launcher restarts in the pod)"
    sub = pod.get("subdomain")
    svc = services.get((ns, sub or ""))
    if svc is None:
        yield f"{where}: spec.template.spec.subdomain: {sub!r} names no Service in {ns}; no pod DNS"
    else:
        sspec = svc.get("spec", {})
        if sspec.get("clusterIP") != "None":
            yield f"{where}: Service {sub}: clusterIP must be None (headless) for per-pod DNS"
        if not sspec.get("publishNotReadyAddresses"):
            yield f"{where}: Service {sub}: publishNotReadyAddresses must be true so rank 0 resolves early"
        labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
        if any(labels.get(k) != v for k, v in sspec.get("selector", {}).items()):
            yield f"{where}: Service {sub}: its selector does not match the pod labels"
        want = master_addr(name, sub, ns)
        for i, c in enumerate(pod.get("containers", [])):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if env.get("MASTER_ADDR") != want:
                yield (
                    f"{where}: spec.template.spec.containers[{i}].env.MASTER_ADDR: "
                    f"{env.get('MASTER_ADDR')!r} "
                    f"must be {want!r}"
                )


def _label_problems(where: str, path: str, meta: dict[str, Any]) -> Iterator[str]:
    """Label and annotation keys are qualified names; label values follow the label-value rule."""
    for key, value in (meta.get("labels") or {}).items():
        if problem := names.qualified_name(str(key)):
            yield f"{where}: {path}labels: key {key!r} {problem}"
        if problem := names.label_value(str(value)):
            yield f"{where}: {path}labels[{key}]: value {value!r} {problem}"
    for key in meta.get("annotations") or {}:
        if problem := names.qualified_name(str(key)):
            yield f"{where}: {path}annotations: key {key!r} {problem}"


def _selector_problems(where: str, pod: dict[str, Any]) -> Iterator[str]:
    for key, value in (pod.get("nodeSelector") or {}).items():
        if problem := names.qualified_name(str(key)):
            yield f"{where}: spec.template.spec.nodeSelector: key {key!r} {problem}"
        if problem := names.label_value(str(value)):
            yield f"{where}: spec.template.spec.nodeSelector[{key}]: value {value!r} {problem}"


def _template_problems(where: str, path: str, template: dict[str, Any]) -> Iterator[str]:
    """The Job's pod rules for a pod template embedded in a JobSet or a runtime (fsdpkit.k8s.kinds)."""
    yield from _label_problems(where, f"{path}.metadata.", template.get("metadata") or {})
    yield from _selector_problems(where, template.get("spec") or {})
    yield from _pod_spec_problems(where, template.get("spec") or {})


def _kind_problems(
    where: str, obj: dict[str, Any], manifests: list[Manifest], services: Any
) -> Iterator[str]:
    """JobSet, ClusterTrainingRuntime and TrainJob: the kit's rules beyond their schemas."""
    kind = obj.get("kind")
    if kind == "TrainJob":
        runtimes = {
            m.obj["metadata"]["name"]: m.obj
            for m in manifests
            if m.obj.get("kind") == "ClusterTrainingRuntime"
        }
        yield from kind_checks.trainjob_problems(where, obj, runtimes)
    elif kind in ("JobSet", "ClusterTrainingRuntime"):
        # a runtime's JobSet is its TrainJob's: named after it, in its namespace
        meta = obj.get("metadata") or {}
        owner = next(
            (
                m.obj["metadata"]
                for m in manifests
                if m.obj.get("kind") == "TrainJob"
                and (m.obj.get("spec") or {}).get("runtimeRef", {}).get("name") == meta.get("name")
            ),
            meta,
        )
        yield from kind_checks.jobset_problems(
            where,
            obj,
            services,
            _template_problems,
            namespace=owner.get("namespace", "default"),
            set_name=owner.get("name", ""),
        )


def policy_problems(manifests: Iterable[Manifest], *, allow_placeholders: bool = False) -> list[str]:
    """The kit's own rules over the whole set of manifests."""
    manifests = list(manifests)
    problems: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    services = {
        (m.obj["metadata"].get("namespace", "default"), m.obj["metadata"]["name"]): m.obj
        for m in manifests
        if m.obj.get("kind") == "Service"
    }
    for m in manifests:
        where, obj = _where(m), m.obj
        meta = obj.get("metadata", {})
        key = (obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))
        if key in seen:
            problems.append(f"{where}: metadata.name: duplicate {key[0]} name")
        seen.add(key)
        if problem := names.dns1123_subdomain(meta.get("name", "")):
            problems.append(f"{where}: metadata.name: {problem}")
        problems.extend(_label_problems(where, "metadata.", meta))
        for path, text in _walk_strings(obj):
            if not allow_placeholders and PLACEHOLDER in text:
                problems.append(
                    f"{where}: {path}: dry-run placeholder {text!r}; deploy and pass OUTPUTS=<file>"
                )
            if contains_credential(text):
                problems.append(f"{where}: {path}: contains what looks like a credential; use a Secret")
        if obj.get("kind") == "Job":
            template = obj.get("spec", {}).get("template", {})
            problems.extend(_label_problems(where, "spec.template.metadata.", template.get("metadata", {})))
            problems.extend(_selector_problems(where, template.get("spec", {})))
            problems.extend(_pod_spec_problems(where, template.get("spec", {})))
            problems.extend(_job_problems(where, obj, services))
        problems.extend(_kind_problems(where, obj, manifests, services))
        if obj.get("kind") == "Deployment":  # the rendezvous store: the same pod rules as the trainers
            template = obj.get("spec", {}).get("template", {})
            problems.extend(_label_problems(where, "spec.template.metadata.", template.get("metadata", {})))
            problems.extend(_selector_problems(where, template.get("spec", {})))
            problems.extend(_pod_spec_problems(where, template.get("spec", {})))
    return problems


def validate(
    manifests: Iterable[Manifest],
    *,
    versions: Iterable[str] = SCHEMA_VERSIONS,
    allow_placeholders: bool = False,
) -> None:
    """Schemas of every version in `versions` plus the policy; ManifestError lists every problem."""
    manifests = list(manifests)
    problems: list[str] = []
    for version in sorted(set(versions), key=lambda v: tuple(int(x) for x in v.split("."))):
        problems.extend(schema_problems(manifests, version))
    problems.extend(policy_problems(manifests, allow_placeholders=allow_placeholders))
    if problems:
        raise ManifestError(problems)
