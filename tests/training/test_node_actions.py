"""training/launcher/node_actions.py: a rank's eviction request taken from the launcher's channel and acted on
once (the cordon, the event, the drain), directly or through the pod's node agent (node_agent.py); the
cordon against a real HTTPS server on 127.0.0.1 that plays the Kubernetes API server: it checks what a real
one checks (method, path, content type, bearer token, a merge-patch body) and answers 200 or 403 as RBAC
would. The pod's service-account folder (token, ca.crt) is a temporary one whose CA signed the server's
certificate, so the client's TLS verification is the real one, with no test hook in the code."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fsdpkit.launcher.node_actions import (
    AGENT_DIR_ENV,
    FIELD_MANAGER,
    NODE_NAME_ENV,
    REASON_ANNOTATION,
    REQUEST_PREFIX,
    RESULT_PREFIX,
    STRAGGLER_LABEL,
    NodeActions,
    ask_node_agent,
    mark_straggler_node,
)
from fsdpkit.launcher.node_agent import handle_pending, serve
from fsdpkit.runtime.events import EventLog, read_events
from fsdpkit.runtime.eviction import REQUEST_FILE, EvictionRequest, request_eviction

NODE = "ip-10-0-1-5.ec2.internal"
LOOPBACK = "127.0.0.1"
NO_ANSWER = f"node {NODE} not cordoned: no usable answer from the API server at {LOOPBACK}:"
TOKEN = "kit-test-token"
REASON = "run r1: rank 1 (pod r1-1) computed 3.00x slower than its peers from step ~4; evicted at step 6"


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    x509 = pytest.importorskip("cryptography.x509", reason="the TLS server needs `cryptography` (dev deps)")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.crt", folder / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class FakeApiServer:
    """The API server boundary: one node, one token allowed to patch it (status 200) unless `forbid`."""

    port: int = 0
    forbid: bool = False
    garbage: bool = False
    """Answer bytes that are not HTTP (a proxy or a broken middlebox in the way)."""
    requests: list[dict] = field(default_factory=list)


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    return _self_signed(tmp_path)


@pytest.fixture
def api(tls_files: tuple[Path, Path]) -> Iterator[FakeApiServer]:
    state = FakeApiServer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append(
                {"path": self.path, "headers": dict(self.headers), "body": json.loads(body or b"null")}
            )
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._answer(401, {"kind": "Status", "reason": "Unauthorized", "code": 401})
            if self.headers.get("Content-Type") != "application/merge-patch+json":
                return self._answer(415, {"kind": "Status", "reason": "UnsupportedMediaType", "code": 415})
            if self.path != f"/api/v1/nodes/{NODE}?fieldManager={FIELD_MANAGER}":
                return self._answer(404, {"kind": "Status", "reason": "NotFound", "code": 404})
            if state.garbage:
                self.wfile.write(b"SSH-2.0-OpenSSH\r\n\r\n")
                return None
            if state.forbid:
                return self._answer(403, {"kind": "Status", "reason": "Forbidden", "code": 403})
            return self._answer(200, {"kind": "Node", "metadata": {"name": NODE}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls_files)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def sa_dir(tmp_path: Path, tls_files: tuple[Path, Path]) -> Path:
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(TOKEN + "\n", encoding="utf-8")
    (folder / "ca.crt").write_bytes(tls_files[0].read_bytes())
    return folder


def _env(port: int) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port), NODE_NAME_ENV: NODE}


def test_the_node_is_cordoned_labelled_and_annotated(api: FakeApiServer, sa_dir: Path) -> None:
    mark = mark_straggler_node(REASON, env=_env(api.port), sa_dir=sa_dir)
    assert mark.cordoned and mark.node == NODE, mark.line
    assert mark.line == f"node {NODE} cordoned and labelled {STRAGGLER_LABEL}=true: nothing new lands there"
    (request,) = api.requests
    assert request["body"] == {
        "metadata": {"labels": {STRAGGLER_LABEL: "true"}, "annotations": {REASON_ANNOTATION: REASON}},
        "spec": {"unschedulable": True},
    }


def test_a_forbidden_patch_is_one_line_that_says_what_to_do(api: FakeApiServer, sa_dir: Path) -> None:
    api.forbid = True
    mark = mark_straggler_node(REASON, env=_env(api.port), sa_dir=sa_dir)
    assert not mark.cordoned and len(api.requests) == 1
    assert mark.line.startswith(f"node {NODE} not cordoned: the API server answered 403 Forbidden ")
    assert "kit-node-cordon ClusterRole" in mark.line and f"kubectl cordon {NODE}" in mark.line
    assert "\n" not in mark.line


def test_an_answer_that_is_not_http_is_one_line_too(api: FakeApiServer, sa_dir: Path) -> None:
    api.garbage = True
    mark = mark_straggler_node(REASON, env=_env(api.port), sa_dir=sa_dir)
    assert not mark.cordoned and len(api.requests) == 1
    assert mark.line.startswith(NO_ANSWER)
    assert "BadStatusLine" in mark.line or "SSH-2.0" in mark.line


def test_a_wrong_token_is_refused_by_the_server(api: FakeApiServer, sa_dir: Path) -> None:
    (sa_dir / "token").write_text("someone-else", encoding="utf-8")
    mark = mark_straggler_node(REASON, env=_env(api.port), sa_dir=sa_dir)
    assert not mark.cordoned and "answered 401 Unauthorized" in mark.line


def test_a_server_the_cluster_ca_did_not_sign_is_not_trusted(
    api: FakeApiServer, sa_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (sa_dir / "ca.crt").write_bytes(_self_signed(other)[0].read_bytes())
    mark = mark_straggler_node(REASON, env=_env(api.port), sa_dir=sa_dir)
    assert not mark.cordoned and api.requests == []  # no token was sent to it
    assert mark.line.startswith(NO_ANSWER)
    assert "CERTIFICATE_VERIFY_FAILED" in mark.line


def test_a_silent_server_costs_the_timeout_only(sa_dir: Path) -> None:
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        mark = mark_straggler_node(REASON, env=_env(port), sa_dir=sa_dir, timeout_s=0.2)
    assert not mark.cordoned
    assert mark.line.startswith(f"{NO_ANSWER}{port} ")
    assert "0.2 s allowed" in mark.line and f"kubectl cordon {NODE}" in mark.line


def test_outside_kubernetes_it_says_so_and_calls_nothing(sa_dir: Path) -> None:
    mark = mark_straggler_node(REASON, env={NODE_NAME_ENV: "laptop"}, sa_dir=sa_dir)
    assert (mark.cordoned, mark.node) == (False, "laptop")
    assert mark.line == (
        "node not cordoned: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST); nothing to cordon here"
    )


def test_without_the_node_name_or_the_token_it_says_which(tmp_path: Path, sa_dir: Path) -> None:
    env = _env(1)
    del env[NODE_NAME_ENV]
    mark = mark_straggler_node(REASON, env=env, sa_dir=sa_dir)
    assert not mark.cordoned and mark.line.startswith(f"node not cordoned: {NODE_NAME_ENV} is not set ")
    mark = mark_straggler_node(REASON, env=_env(1), sa_dir=tmp_path / "absent")
    assert not mark.cordoned
    assert mark.line.startswith(f"node {NODE} not cordoned: no service-account token or CA in ")
    assert "FileNotFoundError" in mark.line


def _request(folder: Path) -> None:
    request_eviction(folder, EvictionRequest(rank=3, step=7, pod=1, reason=REASON))


def test_the_launcher_takes_a_ranks_request_once_cordons_records_and_drains(
    tmp_path: Path, api: FakeApiServer, sa_dir: Path
) -> None:
    folder, drains = tmp_path / "hb", []
    folder.mkdir()
    events = EventLog(tmp_path / "run", role="launcher", rank=None)
    actions = NodeActions(
        events=events, env=_env(api.port), folder=lambda: str(folder), drain=lambda: drains.append(1),
        sa_dir=sa_dir,
    )  # fmt: skip
    actions.poll()
    assert (drains, api.requests) == ([], [])  # nothing asked: nothing done
    _request(folder)
    actions.poll()
    actions.poll()
    _request(folder)  # a second rank's request while the pod drains: the node is already going
    actions.poll()
    assert drains == [1] and len(api.requests) == 1
    assert api.requests[0]["body"]["metadata"]["annotations"] == {REASON_ANNOTATION: REASON}
    (event,) = [e for e in read_events(tmp_path / "run") if e["kind"] == "straggler_node"]
    assert (event["role"], event["target_rank"], event["step"], event["pod"]) == ("launcher", 3, 7, 1)
    assert (event["evict"], event["cordoned"], event["node_name"]) == (True, True, NODE)


def test_a_file_that_is_not_a_request_is_set_aside_with_one_line(tmp_path: Path, caplog) -> None:
    folder, drains = tmp_path / "hb", []
    folder.mkdir()
    (folder / REQUEST_FILE).write_bytes(b"\xff{not json")
    actions = NodeActions(
        events=EventLog(tmp_path / "run", role="launcher", rank=None), env={}, folder=lambda: str(folder),
        drain=lambda: drains.append(1),
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="kit.launch"):
        actions.poll()
    assert drains == [] and not (folder / REQUEST_FILE).exists()
    (line,) = caplog.messages
    assert (
        line.startswith(f"kit-launch: {folder / REQUEST_FILE} is not an eviction request (")
        and "ignored" in line
    )


# -- the node agent: the launcher holds no token; the sidecar does the patch --------------------------------
@pytest.fixture
def agent(tmp_path: Path, api: FakeApiServer, sa_dir: Path) -> Iterator[Path]:
    """A real node agent (fsdpkit.launcher.node_agent.serve) on a shared folder, in a thread."""
    folder = tmp_path / "agent"
    folder.mkdir()
    stop = threading.Event()
    env = _env(api.port)  # only the agent knows the API server and holds the token
    thread = threading.Thread(
        target=serve, kwargs={"folder": folder, "env": env, "stop": stop, "sa_dir": sa_dir, "poll_s": 0.02},
        daemon=True,
    )  # fmt: skip
    thread.start()
    yield folder
    stop.set()
    thread.join()


def test_with_a_node_agent_the_launcher_cordons_without_a_token(
    tmp_path: Path, api: FakeApiServer, agent: Path
) -> None:
    folder, drains = tmp_path / "hb", []
    folder.mkdir()
    launcher_env = {AGENT_DIR_ENV: str(agent), NODE_NAME_ENV: NODE}  # no API server, no token path
    actions = NodeActions(
        events=EventLog(tmp_path / "run", role="launcher", rank=None), env=launcher_env,
        folder=lambda: str(folder), drain=lambda: drains.append(1), sa_dir=tmp_path / "no-token-here",
    )  # fmt: skip
    _request(folder)
    actions.poll()
    assert drains == [1]
    (request,) = api.requests
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert request["body"]["metadata"]["annotations"] == {REASON_ANNOTATION: REASON}
    (event,) = [e for e in read_events(tmp_path / "run") if e["kind"] == "straggler_node"]
    assert (event["cordoned"], event["node_name"]) == (True, NODE)
    assert list(agent.iterdir()) == []  # request and answer both gone


def test_the_agents_refusal_reaches_the_launcher_as_one_line(api: FakeApiServer, agent: Path) -> None:
    api.forbid = True  # e.g. the admission policy refused a node that is not the pod's own
    mark = ask_node_agent(REASON, env={AGENT_DIR_ENV: str(agent), NODE_NAME_ENV: NODE})
    assert not mark.cordoned
    assert mark.line.startswith(f"node {NODE} not cordoned: the API server answered 403 Forbidden ")


def test_no_agent_answer_is_one_line_too(tmp_path: Path) -> None:
    mark = ask_node_agent(REASON, env={AGENT_DIR_ENV: str(tmp_path), NODE_NAME_ENV: NODE}, wait_s=0.1)
    assert not mark.cordoned
    assert mark.line.startswith(f"node {NODE} not cordoned: the node agent did not answer within 0.1 s ")
    assert f"kubectl cordon {NODE}" in mark.line
    missing = ask_node_agent(REASON, env={AGENT_DIR_ENV: str(tmp_path / "absent"), NODE_NAME_ENV: NODE})
    assert missing.line.startswith(f"node {NODE} not cordoned: cannot leave the request for the node agent ")


def test_the_agent_answers_a_request_that_is_not_one(tmp_path: Path, sa_dir: Path) -> None:
    (tmp_path / f"{REQUEST_PREFIX}x.json").write_text("[1, 2", encoding="utf-8")
    assert handle_pending(tmp_path, env={NODE_NAME_ENV: NODE}, sa_dir=sa_dir) == 1
    answer = json.loads((tmp_path / f"{RESULT_PREFIX}x.json").read_text(encoding="utf-8"))
    assert answer["cordoned"] is False and answer["line"].startswith(
        "node not cordoned: cordon-x.json is not "
    )
    assert not (tmp_path / f"{REQUEST_PREFIX}x.json").exists()
