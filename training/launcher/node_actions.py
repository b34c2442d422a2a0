"""What the launcher does to its own node: a straggler's node cordoned, labelled and annotated, then drained.

When `STRAGGLER_POLICY=replace` evicts a slow node for a hot spare, the Job replaces the drained pod; without
a cordon the scheduler may put that pod (the new spare) back on the same slow node. The ranks only report:
the slow node's local rank 0 leaves a request in the launcher's channel (training/runtime/eviction.py), and
its launcher (`NodeActions.poll`, every monitor tick) patches its own Node object, then drains its pod:

    PATCH /api/v1/nodes/<KIT_NODE_NAME>     (application/merge-patch+json)
    {"metadata": {"labels": {"kit.io/straggler": "true"}, "annotations": {"kit.io/straggler-reason": ...}},
     "spec": {"unschedulable": true}}

On EKS the launcher holds no API token: the Job renders a node agent (a native sidecar, node_agent.py)
that alone mounts a pod-bound service-account token, and KIT_NODE_AGENT_DIR names the folder both share.
The launcher leaves the request there and logs the agent's answer (`ask_node_agent`), so no process of the
ranks' container can read the token. Without KIT_NODE_AGENT_DIR (a launcher started by hand, the local
runner) the launcher calls the API itself as before (`mark_straggler_node`).

`mark_straggler_node` calls the API server the way any in-cluster client does: KUBERNETES_SERVICE_HOST/PORT
(the kubelet sets them in every container), the service-account token and the cluster CA under SA_DIR, and
the node name from the downward API (`spec.nodeName` in KIT_NODE_NAME). Standard library only.

`mark_straggler_node` never raises and never blocks the drain for long: outside Kubernetes (the local runner
sets no KUBERNETES_SERVICE_HOST), with no token, on a 403 or an unreachable server (TIMEOUT_S per socket
operation) it returns one line saying the node is not cordoned, why, and the kubectl command that does it.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpkit.contracts import env
from fsdpkit.runtime.eviction import take_eviction

if TYPE_CHECKING:
    from fsdpkit.runtime.events import EventLog

NODE_NAME_ENV = env.NODE_NAME
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts the service account's `token` and the cluster's `ca.crt`."""
STRAGGLER_LABEL = "kit.io/straggler"
"""Label on a node the kit evicted as a straggler ("true"): `kubectl get nodes -l kit.io/straggler`."""
REASON_ANNOTATION = "kit.io/straggler-reason"
"""Annotation on that node: which run, pod and rank, how much slower, at which step."""
FIELD_MANAGER = "kit-launcher"
"""The patch's field manager (shown in the Node's managedFields)."""
TIMEOUT_S = 3.0
"""Seconds per socket operation (connect, read): a slow or absent API server delays the drain this much."""
AGENT_DIR_ENV = env.NODE_AGENT_DIR
"""The folder shared with the pod's node agent; unset: the launcher calls the API server itself."""
REQUEST_PREFIX = "cordon-"
"""A request in that folder: `cordon-<id>.json`, {"reason": ...}."""
RESULT_PREFIX = "answer-"
"""The agent's answer: `answer-<id>.json`, {"cordoned": bool, "node": str | null, "line": str}."""
AGENT_WAIT_S = 2 * TIMEOUT_S + 2.0
"""How long the launcher waits for the agent: its connect and read, plus its poll and a margin."""
AGENT_POLL_S = 0.05

log = logging.getLogger("kit.launch")


@dataclass(frozen=True)
class NodeMark:
    """The outcome of one attempt: whether the node is cordoned, and the one line that says so."""

    cordoned: bool
    node: str | None
    line: str


def _kubectl(node: str) -> str:
    return f"kubectl cordon {node} && kubectl label node {node} {STRAGGLER_LABEL}=true"


def mark_straggler_node(
    reason: str,
    *,
    env: Mapping[str, str],
    sa_dir: Path = SA_DIR,
    timeout_s: float = TIMEOUT_S,
) -> NodeMark:
    """Cordon this pod's node and label it a straggler's, with `reason` as the annotation; never raises."""
    node = env.get(NODE_NAME_ENV, "")
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return NodeMark(
            False, node or None,
            "node not cordoned: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST); nothing to cordon here",
        )  # fmt: skip
    if not node:
        return NodeMark(
            False, None,
            f"node not cordoned: {NODE_NAME_ENV} is not set (the Job renders it with "
            "STRAGGLER_POLICY=replace and SPARES); find the pod's node with `kubectl get pod -o wide` and "
            "cordon it by hand",
        )  # fmt: skip
    try:
        token = (sa_dir / "token").read_text(encoding="utf-8").strip()
        context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        return NodeMark(
            False, node,
            f"node {node} not cordoned: no service-account token or CA in {sa_dir} "
            f"({exc.__class__.__name__}: the Job mounts them with STRAGGLER_POLICY=replace and SPARES); "
            f"by hand: {_kubectl(node)}",
        )  # fmt: skip
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return _patch_node(node, netloc, _patch_request(node, netloc, reason, token), context, timeout_s)


def _patch_request(node: str, netloc: str, reason: str, token: str) -> urllib.request.Request:
    url = f"https://{netloc}/api/v1/nodes/{urllib.parse.quote(node, safe='')}?fieldManager={FIELD_MANAGER}"
    body = {
        "metadata": {"labels": {STRAGGLER_LABEL: "true"}, "annotations": {REASON_ANNOTATION: reason}},
        "spec": {"unschedulable": True},
    }
    return urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
            "Accept": "application/json",
        },
    )


def _patch_node(
    node: str, netloc: str, request: urllib.request.Request, context: ssl.SSLContext, timeout_s: float
) -> NodeMark:
    """Send the patch straight to the API server's service address (a proxy in the pod's env is for the
    outside world); one line whatever it answers."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        hint = (
            " (the ServiceAccount needs `patch` on nodes: the kit-node-cordon ClusterRole, rendered with "
            "STRAGGLER_POLICY=replace and SPARES; its admission policy allows only the pod's own node and "
            "the kit's label, annotation and cordon)"
            if exc.code in (403, 422)
            else ""
        )
        return NodeMark(
            False, node,
            f"node {node} not cordoned: the API server answered {exc.code} {exc.reason}{hint}; by hand: "
            f"{_kubectl(node)}",
        )  # fmt: skip
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, TLS, timeout, refused, junk
        cause = getattr(exc, "reason", None) or exc
        return NodeMark(
            False, node,
            f"node {node} not cordoned: no usable answer from the API server at {netloc} ({cause}; "
            f"{timeout_s:g} s allowed); by hand: {_kubectl(node)}",
        )  # fmt: skip
    return NodeMark(
        True, node, f"node {node} cordoned and labelled {STRAGGLER_LABEL}=true: nothing new lands there"
    )


def write_json(path: Path, data: dict[str, object]) -> None:
    """Write `path` whole or not at all (a reader never sees half a file): a temporary name, then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def ask_node_agent(reason: str, *, env: Mapping[str, str], wait_s: float = AGENT_WAIT_S) -> NodeMark:
    """Hand the cordon to the pod's node agent (AGENT_DIR_ENV) and return its answer; never raises."""
    folder, node = Path(env[AGENT_DIR_ENV]), env.get(NODE_NAME_ENV) or None
    ident = uuid.uuid4().hex
    answer = folder / f"{RESULT_PREFIX}{ident}.json"
    try:
        write_json(folder / f"{REQUEST_PREFIX}{ident}.json", {"reason": reason})
    except OSError as exc:
        return NodeMark(
            False, node,
            f"node {node} not cordoned: cannot leave the request for the node agent in {folder} "
            f"({exc.strerror or exc}); by hand: {_kubectl(node or '<node>')}",
        )  # fmt: skip
    deadline = time.monotonic() + wait_s
    while not answer.exists():
        if time.monotonic() >= deadline:
            return NodeMark(
                False, node,
                f"node {node} not cordoned: the node agent did not answer within {wait_s:g} s (kubectl logs "
                f"<pod> -c node-agent); by hand: {_kubectl(node or '<node>')}",
            )  # fmt: skip
        time.sleep(AGENT_POLL_S)
    try:
        data = json.loads(answer.read_text(encoding="utf-8"))
        answer.unlink()
        return NodeMark(bool(data["cordoned"]), data.get("node") or node, str(data["line"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return NodeMark(
            False, node,
            f"node {node} not cordoned: the node agent's answer {answer} is unreadable ({exc}); by hand: "
            f"{_kubectl(node or '<node>')}",
        )  # fmt: skip


class NodeActions:
    """The launcher's side of an eviction: takes a rank's request from the heartbeat folder, cordons the
    node through the node agent when the pod has one, else itself (one line either way), records the
    `straggler_node` event and drains this pod, once."""

    def __init__(
        self,
        *,
        events: EventLog,
        env: Mapping[str, str],
        folder: Callable[[], str | None],
        drain: Callable[[], None],
        sa_dir: Path = SA_DIR,
    ) -> None:
        self.events = events
        self.sa_dir = sa_dir
        self.env = env
        self.folder = folder
        """The current heartbeat folder (the launcher makes one per worker group), None before the first."""
        self.drain = drain
        self.draining = False

    def poll(self) -> None:
        """Act on a request left since the last tick; a cheap no-op otherwise (one stat)."""
        folder = self.folder()
        if self.draining or not folder:
            return
        request = take_eviction(folder)
        if request is None:
            return
        if isinstance(request, str):
            log.warning("kit-launch: %s", request)
            return
        if self.env.get(AGENT_DIR_ENV):
            mark = ask_node_agent(request.reason, env=self.env)
        else:
            mark = mark_straggler_node(request.reason, env=self.env, sa_dir=self.sa_dir)
        log.warning("kit-launch: %s", mark.line)
        self.events.emit(
            "straggler_node", step=request.step, target_rank=request.rank, pod=request.pod, evict=True,
            node_name=self.env.get(NODE_NAME_ENV) or None, cordoned=mark.cordoned,
        )  # fmt: skip
        self.draining = True
        self.drain()
