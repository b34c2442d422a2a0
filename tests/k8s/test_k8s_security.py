"""The run's security objects (fsdpkit.k8s.security): the NetworkPolicy evaluated on rendered pods, the run's
token Secret and its mounts, the run folder as the only writable part of FSx, the node agent's narrow grant,
the image pinned by digest, and the namespace's Pod Security level checked against the standard's rules."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fsdpkit.contracts import env as kit_env
from fsdpkit.k8s import security
from fsdpkit.k8s.render import Manifest, render
from fsdpkit.k8s.validate import SCHEMA_VERSIONS, validate
from fsdpkit.k8s.values import ValuesError, build_values

DIGEST = "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer@sha256:" + "ab" * 32
TAGGED = "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer:v1"
REPLACE = ["STRAGGLER_POLICY=replace", "SPARES=1"]


def _render(*overrides: str) -> list[Manifest]:
    given = list(overrides)
    if not any(o.startswith("RUN_ID=") for o in given):
        given.insert(0, "RUN_ID=t")
    return render(build_values(outputs=None, overrides=given, allow_placeholders=True))


def _kind(manifests: list[Manifest], kind: str) -> list[dict[str, Any]]:
    return [m.obj for m in manifests if m.obj["kind"] == kind]


def _pods(manifests: list[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod template) of every pod the manifests make: the Job's and the store's."""
    return [
        (o["metadata"]["namespace"], o["spec"]["template"])
        for o in manifests_objs(manifests)
        if o["kind"] in ("Job", "Deployment")
    ]


def manifests_objs(manifests: list[Manifest]) -> list[dict[str, Any]]:
    return [m.obj for m in manifests]


def _trainer(manifests: list[Manifest]) -> dict[str, Any]:
    (job,) = _kind(manifests, "Job")
    return job["spec"]["template"]["spec"]


# -- NetworkPolicy: the selectors evaluated as the API defines them (networking.k8s.io/v1) ----------------
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpressions rule holds."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for rule in selector.get("matchExpressions", []):
        has, value = rule["key"] in labels, labels.get(rule["key"])
        ok = {
            "In": has and value in rule.get("values", []),
            "NotIn": not has or value not in rule.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[rule["operator"]]
        if not ok:
            return False
    return True


def _admitted(policy: dict[str, Any], src: tuple[str, dict[str, str]], dst: tuple[str, dict[str, str]],
              port: int) -> bool:  # fmt: skip
    """Whether `policy` lets a pod (namespace, labels) reach a pod it selects on TCP `port`."""
    spec, ns = policy["spec"], policy["metadata"]["namespace"]
    assert dst[0] == ns and _selects(spec["podSelector"], dst[1]), "the policy does not select this pod"
    assert spec["policyTypes"] == ["Ingress"]
    for rule in spec.get("ingress", []):
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port for p in ports):
            continue
        for peer in rule.get("from", []):
            assert "ipBlock" not in peer, "an ipBlock would admit by address, not by pod"
            if "namespaceSelector" in peer:
                continue  # the kit renders none; a pod of another namespace would need one
            if src[0] == ns and _selects(peer.get("podSelector", {}), src[1]):
                return True
    return False


def _listening_ports(manifests: list[Manifest]) -> list[int]:
    """Every containerPort the run's pods declare (the rendezvous, workers' and in-process stores)."""
    return sorted({
        p["containerPort"] for _, pod in _pods(manifests) for c in pod["spec"]["containers"]
        for p in c.get("ports", [])
    })  # fmt: skip


@pytest.mark.parametrize("launcher", ["kit", "torchrun", "ft_launcher"])
@pytest.mark.parametrize("profile", ["p5", "local"])
def test_every_job_has_a_policy_that_admits_only_its_own_pods(profile: str, launcher: str) -> None:
    spares = ["SPARES=1"] if launcher == "kit" else []
    own = _render(f"PROFILE={profile}", f"LAUNCHER={launcher}", *spares)
    (policy,) = _kind(own, "NetworkPolicy")
    pods = [(ns, pod["metadata"]["labels"]) for ns, pod in _pods(own)]
    assert len(pods) == (2 if launcher == "kit" else 1)  # the trainers (spares included) and the store
    other_run = [(ns, p["metadata"]["labels"]) for ns, p in _pods(_render("RUN_ID=u", f"PROFILE={profile}"))]
    other_ns = [
        (ns, p["metadata"]["labels"]) for ns, p in _pods(_render("NAMESPACE=team-b", f"PROFILE={profile}"))
    ]
    ports = _listening_ports(own)
    assert ports == [29500, 29501, 29502]
    for dst in pods:
        for port in [*ports, 40123]:  # a round's store on a free port too
            assert all(_admitted(policy, src, dst, port) for src in pods)
            assert not any(_admitted(policy, src, dst, port) for src in other_run)
            assert not any(_admitted(policy, src, dst, port) for src in other_ns)
    validate(own, versions=SCHEMA_VERSIONS, allow_placeholders=True)


def test_a_pod_without_the_runs_labels_is_refused() -> None:
    own = _render()
    (policy,) = _kind(own, "NetworkPolicy")
    ns, trainer = _pods(own)[0]
    labels = dict(trainer["metadata"]["labels"])
    del labels[security.RUN_ID_LABEL]
    assert not _admitted(policy, (ns, labels), (ns, trainer["metadata"]["labels"]), 29500)


# -- the run's token ---------------------------------------------------------------------------------------
def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_token_is_mounted_read_only_in_the_runs_pods_only() -> None:
    manifests = _render()
    values = build_values(outputs=None, overrides=["RUN_ID=t"], allow_placeholders=True)
    secret = security.run_token_secret(values, {"kit.io/run-id": "t"}, "0f" * 32)
    kubernetes_validate.validate(secret, "1.35.0", strict=True)
    for _, pod in _pods(manifests):
        spec = pod["spec"]
        (container,) = spec["containers"]
        mount = _mounts(container)[security.RUN_TOKEN_DIR]
        assert mount["readOnly"] is True
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["secret"] == {"secretName": "t-run-token", "defaultMode": 0o400,
                                    "items": [{"key": "token", "path": "token"}]}  # fmt: skip
        assert secret["metadata"]["name"] == volume["secret"]["secretName"]
        assert _env(container)[kit_env.RUN_TOKEN_FILE] == "/var/run/fsdpkit/run-token/token"
    assert not _kind(manifests, "Secret")  # never in a file: `apply` makes it, once
    (configmap,) = _kind(manifests, "ConfigMap")
    checksum = configmap["metadata"]["annotations"]["kit.io/config-sha256"]
    for m in manifests:  # the only 64-hex string anywhere is the config's checksum
        assert set(re.findall(r"\b[0-9a-f]{64}\b", m.text)) <= {checksum}, m.filename


def test_locally_the_runner_provides_the_token_itself() -> None:
    """The local runner writes a fresh token file per run (k8s/local.py); the Job mounts no Secret there."""
    manifests = _render("PROFILE=local")
    assert all("secret" not in v for _, pod in _pods(manifests) for v in pod["spec"].get("volumes", []))


# -- the run's folder ---------------------------------------------------------------------------------------
def test_a_pod_writes_only_its_own_run_folder() -> None:
    trainer = _trainer(_render())["containers"][0]
    fsx = {m["mountPath"]: m for m in trainer["volumeMounts"] if m["name"] == "fsx"}
    writable = sorted(p for p, m in fsx.items() if not m.get("readOnly"))
    assert writable == ["/fsx/runs/t"] and fsx["/fsx/runs/t"]["subPath"] == "runs/t"
    assert sorted(p for p, m in fsx.items() if m.get("readOnly")) == [
        "/fsx/cache", "/fsx/code", "/fsx/data", "/fsx/models", "/fsx/tokenizers",
    ]  # fmt: skip
    assert all(m["subPath"] == p.removeprefix("/fsx/") for p, m in fsx.items())
    # another run's folder is not below any writable mount
    assert not any("/fsx/runs/u/checkpoints".startswith(p + "/") for p in writable)
    assert _env(trainer)["HF_HOME"] == "/fsx/runs/t/cache/huggingface"


def test_shards_must_be_a_read_only_input() -> None:
    with pytest.raises(ValuesError, match=r"^DATA_PATH=/fsx/scratch/c4: must be under one of /fsx/models/, "):
        _render("DATA_KIND=shards", "DATA_PATH=/fsx/scratch/c4")
    _render("DATA_KIND=shards", "DATA_PATH=/fsx/data/c4")


# -- the image ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "policy"),
    [
        ([f"IMAGE={DIGEST}"], "IfNotPresent"),
        ([f"IMAGE={TAGGED}"], "Always"),
        ([], "Always"),  # <EcrRepositoryUri>:latest stand-in
        ([f"IMAGE={TAGGED}", "IMAGE_PULL_POLICY=IfNotPresent"], "IfNotPresent"),  # asked for: kept
    ],
    ids=["digest", "tag", "default-tag", "explicit"],
)
def test_a_digest_is_pulled_once_and_a_tag_always(overrides: list[str], policy: str) -> None:
    manifests = _render(*overrides, *REPLACE)
    for _, pod in _pods(manifests):
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert c["imagePullPolicy"] == policy, c["name"]


# -- Pod Security Admission: the standard's checks the kit's pods touch, as data --------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (Baseline and Restricted tables)
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}  # fmt: skip
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod.get("containers", []) + pod.get("initContainers", [])


def _sc(pod: dict[str, Any], c: dict[str, Any], key: str) -> Any:
    """A container's setting, else the pod's (the standard checks the effective value)."""
    return (c.get("securityContext") or {}).get(key, (pod.get("securityContext") or {}).get(key))


BASELINE: dict[str, Any] = {
    "host namespaces": lambda p: not any(p.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
    "privileged": lambda p: (
        not any((c.get("securityContext") or {}).get("privileged") for c in _containers(p))
    ),
    "capabilities": lambda p: all(
        set((c.get("securityContext") or {}).get("capabilities", {}).get("add", [])) <= BASELINE_CAPS
        for c in _containers(p)
    ),
    "hostPath volumes": lambda p: not any("hostPath" in v for v in p.get("volumes", [])),
    "host ports": lambda p: not any(pt.get("hostPort") for c in _containers(p) for pt in c.get("ports", [])),
    "seccomp": lambda p: all(
        (_sc(p, c, "seccompProfile") or {}).get("type") != "Unconfined" for c in _containers(p)
    ),
    "sysctls": lambda p: not (p.get("securityContext") or {}).get("sysctls"),
    "proc mount": lambda p: all(
        (c.get("securityContext") or {}).get("procMount", "Default") == "Default" for c in _containers(p)
    ),
}
RESTRICTED: dict[str, Any] = {
    "volume types": lambda p: all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in p.get("volumes", [])),
    "privilege escalation": lambda p: all(
        (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is False for c in _containers(p)
    ),
    "running as non-root": lambda p: all(_sc(p, c, "runAsNonRoot") is True for c in _containers(p)),
    "seccomp": lambda p: all(
        (_sc(p, c, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
        for c in _containers(p)
    ),
    "capabilities": lambda p: all(
        "ALL" in (c.get("securityContext") or {}).get("capabilities", {}).get("drop", [])
        and set((c.get("securityContext") or {}).get("capabilities", {}).get("add", []))
        <= {"NET_BIND_SERVICE"}
        for c in _containers(p)
    ),
}


def _failed(rules: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    return [name for name, ok in rules.items() if not ok(pod)]


def _level(pod: dict[str, Any]) -> str:
    if _failed(BASELINE, pod):
        return "privileged"
    return "baseline" if _failed(RESTRICTED, pod) else "restricted"


ORDER = ("privileged", "baseline", "restricted")


def test_the_namespace_enforces_the_strictest_level_the_kits_pods_pass() -> None:
    """p5 trainers fail baseline only for IPC_LOCK (EFA), so `privileged` is the strictest that admits
    them; the store passes baseline; every pod has RuntimeDefault seccomp; warn and audit at restricted."""
    manifests = _render(*REPLACE)
    (ns,) = _kind(manifests, "Namespace")
    labels = ns["metadata"]["labels"]
    pods = {pod["metadata"]["labels"].get("app.kubernetes.io/component", "trainer"): pod["spec"]
            for _, pod in _pods(manifests)}  # fmt: skip
    assert _failed(BASELINE, pods["trainer"]) == ["capabilities"]
    assert _failed(BASELINE, pods["rdzv-store"]) == []
    strictest = min((_level(p) for p in pods.values()), key=ORDER.index)
    assert labels["pod-security.kubernetes.io/enforce"] == strictest == security.PSA_ENFORCE
    assert (
        labels["pod-security.kubernetes.io/warn"]
        == labels["pod-security.kubernetes.io/audit"]
        == "restricted"
    )
    assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.35"
    for pod in pods.values():
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "seccomp" not in _failed(RESTRICTED, pod)
    # Without EFA the trainers add no capability at all: they pass baseline.
    g5_local = _trainer(_render("PROFILE=local"))
    assert _failed(BASELINE, g5_local) == [] and "IPC_LOCK" not in json.dumps(g5_local)


def test_the_psa_checks_can_fail() -> None:
    pod = {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}],
           "volumes": [{"name": "h", "hostPath": {"path": "/"}}], "hostNetwork": True}  # fmt: skip
    assert _failed(BASELINE, pod) == ["host namespaces", "capabilities", "hostPath volumes"]
    assert _level({"containers": [{"name": "c"}]}) == "baseline"  # no drop ALL, no seccomp, may be root


# -- the straggler cordon ----------------------------------------------------------------------------------
def _schema(name: str) -> dict[str, Any]:
    folder = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.35.0-local-strict"
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_the_policy_keeps_every_node_field_but_the_kits() -> None:
    """Every NodeSpec field but unschedulable is compared; so are the ObjectMeta fields a client sets."""
    spec_fields = set(_schema("nodespec-v1.json")["properties"])
    assert set(security.NODE_SPEC_KEPT) == spec_fields - {"unschedulable"}
    meta = set(_schema("objectmeta-meta-v1.json")["properties"])
    system = {"creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp", "generateName",
              "generation", "managedFields", "name", "namespace", "resourceVersion", "selfLink",
              "uid"}  # fmt: skip
    assert set(security.NODE_META_KEPT) == meta - system - {"labels", "annotations"}


def test_the_cordon_is_narrowed_to_the_pods_own_node_and_the_kits_fields() -> None:
    manifests = _render("NAMESPACE=team-a", "SERVICE_ACCOUNT=trainer", *REPLACE)
    validate(manifests, versions=SCHEMA_VERSIONS, allow_placeholders=True)
    (role,) = _kind(manifests, "ClusterRole")
    (binding,) = _kind(manifests, "ClusterRoleBinding")
    (policy,) = _kind(manifests, "ValidatingAdmissionPolicy")
    (policy_binding,) = _kind(manifests, "ValidatingAdmissionPolicyBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert binding["metadata"]["name"] == "kit-node-cordon.team-a.t"  # per run: deleted with it
    assert binding["metadata"]["labels"]["kit.io/run-id"] == "t"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": "team-a"}]
    assert policy_binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"] == {"resourceRules": [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]}  # fmt: skip
    assert spec["matchConditions"] == [{
        "name": "the-runs-service-account",
        "expression": "request.userInfo.username == 'system:serviceaccount:team-a:trainer'",
    }]  # fmt: skip
    rules = [v["expression"] for v in spec["validations"]]
    assert rules[0] == (
        "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra "
        "&& request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]"
    )
    assert rules[1] == "has(object.spec.unschedulable) && object.spec.unschedulable == true"
    for field in security.NODE_SPEC_KEPT:
        assert f"object.spec.{field} == oldObject.spec.{field}" in rules[2]
    assert "'kit.io/straggler'" in rules[4] and "'kit.io/straggler-reason'" in rules[5]
    for rule in rules:  # balanced, and no field of the request's object left unqualified
        assert rule.count("(") == rule.count(")") and rule.count("[") == rule.count("]")


def test_the_token_is_the_node_agents_alone() -> None:
    """The ranks' container mounts no API token and its env names none; only the sidecar mounts one."""
    pod = _trainer(_render(*REPLACE))
    assert pod["automountServiceAccountToken"] is False and not pod.get("shareProcessNamespace")
    (trainer,) = pod["containers"]
    (agent,) = pod["initContainers"]
    assert agent["name"] == "node-agent" and agent["restartPolicy"] == "Always"
    assert agent["command"] == ["python", "-m", "fsdpkit.launcher.node_agent",
                                "--folder=/var/run/fsdpkit/node-agent"]  # fmt: skip
    token_volumes = {v["name"] for v in pod["volumes"] if "projected" in v}
    assert token_volumes == {"node-agent-token"}
    assert {m["name"] for m in trainer["volumeMounts"]} & token_volumes == set()
    assert _mounts(agent)[security.SA_TOKEN_DIR]["name"] == "node-agent-token"
    assert not any("serviceaccount" in json.dumps(v) for v in _env(trainer).values())
    assert _env(trainer)["KIT_NODE_AGENT_DIR"] == _mounts(agent)["/var/run/fsdpkit/node-agent"]["mountPath"]
    assert _mounts(trainer)["/var/run/fsdpkit/node-agent"]["name"] == "node-agent"


def test_the_agent_env_name_is_the_launchers() -> None:
    from fsdpkit.launcher import node_actions

    assert security.NODE_AGENT_DIR_ENV == node_actions.AGENT_DIR_ENV
    assert security.STRAGGLER_LABEL == node_actions.STRAGGLER_LABEL
    assert security.REASON_ANNOTATION == node_actions.REASON_ANNOTATION


def test_the_cordon_needs_kubernetes_1_30() -> None:
    expected = (
        r"^STRAGGLER_POLICY=replace: with SPARES cordons a node, which needs Kubernetes 1\.30 or newer "
        r"\(KUBERNETES_VERSION=1\.29: "
    )
    with pytest.raises(ValuesError, match=expected):
        _render("KUBERNETES_VERSION=1.29", *REPLACE)


def test_locally_there_is_nothing_to_cordon() -> None:
    manifests = _render("PROFILE=local", *REPLACE)
    kinds = {m.obj["kind"] for m in manifests}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"}
    assert "initContainers" not in _trainer(manifests)


# -- the policy's CEL evaluated on sample requests (cel-python: a dev dependency, in requirements/dev.txt) ---
def _node(name: str) -> dict[str, Any]:
    meta = {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": {"ttl": "0"}}
    return {"metadata": meta, "spec": {"providerID": "aws:///us-east-2a/i-0abc", "podCIDR": "10.0.0.0/24"}}


def _cordoned(change: Any = None) -> dict[str, Any]:
    """Node n1 as the agent's patch leaves it, then `change` applied (what else the request would do)."""
    new = _node("n1")
    new["metadata"]["labels"][security.STRAGGLER_LABEL] = "true"
    new["metadata"]["annotations"][security.REASON_ANNOTATION] = "rank 3 computed 3x slower"
    new["spec"]["unschedulable"] = True
    if change is not None:
        change(new)
    return new


OWN_NODE = "patch only the node its pod runs on"
SPEC = "change spec.unschedulable only"
CEL_CASES: dict[str, tuple[dict[str, Any], str | None, list[str]]] = {
    "own node": (_cordoned(), "n1", []),
    "another node": (_cordoned(), "n2", [OWN_NODE]),
    "no node claim": (_cordoned(), None, [OWN_NODE]),
    "uncordon": (_cordoned(lambda n: n["spec"].update(unschedulable=False)), "n1", ["never uncordon"]),
    "a taint": (
        _cordoned(lambda n: n["spec"].update(taints=[{"key": "x", "effect": "NoSchedule"}])),
        "n1",
        [SPEC],
    ),
    "providerID": (_cordoned(lambda n: n["spec"].update(providerID="x")), "n1", [SPEC]),
    "another label": (
        _cordoned(lambda n: n["metadata"]["labels"].update(role="gpu")),
        "n1",
        ["label kit.io/"],
    ),
    "a label removed": (
        _cordoned(lambda n: n["metadata"]["labels"].pop("kubernetes.io/hostname")),
        "n1",
        ["label kit.io/"],
    ),
    "another annotation": (
        _cordoned(lambda n: n["metadata"]["annotations"].update(x="y")),
        "n1",
        ["annotation kit.io/"],
    ),
    "a finalizer": (_cordoned(lambda n: n["metadata"].update(finalizers=["x"])), "n1", ["finalizers"]),
}


@pytest.mark.parametrize("case", CEL_CASES)
def test_the_cordon_policy_on_sample_requests(case: str) -> None:
    """Each rule of the ValidatingAdmissionPolicy evaluated by a CEL interpreter on a node update."""
    celpy = pytest.importorskip(
        "celpy", reason="cel-python evaluates the policy's CEL (make setup installs it)"
    )
    new, claim, refused_by = CEL_CASES[case]
    extra = {security.NODE_NAME_CLAIM: [claim]} if claim else {}
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(_node("n1")),
        "request": celpy.json_to_cel(
            {"userInfo": {"username": "system:serviceaccount:ns:sa", "extra": extra}}
        ),
    }
    env = celpy.Environment()
    refused = []
    for rule in security.cordon_validations():
        result = env.program(env.compile(rule["expression"])).evaluate(activation)
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            refused.append(rule["message"])
    assert len(refused) == len(refused_by), refused
    assert all(want in got for want, got in zip(refused_by, refused, strict=True)), refused


CORDON_KINDS = ("ClusterRole", "ClusterRoleBinding")


def _job_pod(manifests: list[Manifest]) -> dict[str, Any]:
    (job,) = _kind(manifests, "Job")
    return job["spec"]["template"]["spec"]


def _trainer_env(manifests: list[Manifest]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in _job_pod(manifests)["containers"][0]["env"]
    }


def test_straggler_replace_lets_the_pods_cordon_their_node() -> None:
    """STRAGGLER_POLICY=replace with a spare: the node agent (not the ranks) gets an API token, and this run's
    binding lets the job's ServiceAccount patch nodes, narrowed by its policy."""
    manifests = _render("NAMESPACE=team-a", "SERVICE_ACCOUNT=trainer", *REPLACE)
    (role,), (binding,) = (_kind(manifests, kind) for kind in CORDON_KINDS)
    assert role["metadata"]["name"] == "kit-node-cordon" and "namespace" not in role["metadata"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert binding["metadata"]["name"] == "kit-node-cordon.team-a.t"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "kit-node-cordon"}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": "team-a"}]
    assert _trainer_env(manifests)["KIT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert _job_pod(manifests)["automountServiceAccountToken"] is False
    validate(manifests, versions=SCHEMA_VERSIONS, allow_placeholders=True)


@pytest.mark.parametrize(
    "overrides",
    [[], ["STRAGGLER_POLICY=report", "SPARES=1"], ["STRAGGLER_POLICY=off"], ["STRAGGLER_POLICY=replace"]],
    ids=["default", "report-with-spare", "off", "replace-without-spare"],
)
def test_no_node_access_unless_a_straggler_can_be_replaced(overrides: list[str]) -> None:
    """Without a spare, `replace` evicts nothing (only reports): no token, no node name, no ClusterRole."""
    manifests = _render(*overrides)
    assert not [m for m in manifests if m.obj["kind"] in CORDON_KINDS]
    assert "KIT_NODE_NAME" not in _trainer_env(manifests)
    assert _job_pod(manifests)["automountServiceAccountToken"] is False


def test_the_node_name_env_is_the_kits() -> None:
    with pytest.raises(ValueError, match=r"^ENV\.KIT_NODE_NAME=x: is set by the kit or the launcher"):
        _render("ENV.KIT_NODE_NAME=x")
