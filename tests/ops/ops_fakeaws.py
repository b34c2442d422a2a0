"""A local AWS endpoint for the ops tests: moto as a real HTTP server, behind a fault-injecting proxy.

The proxy sits at the HTTP boundary, so botocore's real retry handler and parsers run: a rule matches a
(service, action) pair, optionally only while a condition holds, and answers with a protocol-correct AWS
error (or any response) instead of forwarding. Service comes from the SigV4 credential scope; action from
`X-Amz-Target` (JSON), the `Action=` form field (query / EC2), the Smithy CBOR path, or `METHOD /path` (REST).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from moto.server import ThreadedMotoServer

QUERY_SERVICES = {"cloudformation", "elasticloadbalancing", "sts", "iam", "autoscaling"}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    service: str
    action: str
    params: dict[str, str]


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Rule:
    service: str
    action: str
    """Action name, or `re:<regex>` matched against `METHOD /path` for REST services."""
    respond: Callable[[Request, Callable[[], Response]], Response]
    when: Callable[[Request], bool] = lambda r: True
    times: int | None = None
    """How many requests to answer (None: as long as `when` holds)."""
    hits: int = 0

    def matches(self, req: Request) -> bool:
        if req.service != self.service:
            return False
        if self.action.startswith("re:"):
            if not re.fullmatch(self.action[3:], f"{req.method} {urllib.parse.urlsplit(req.path).path}"):
                return False
        elif req.action != self.action:
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        return self.when(req)


def error_response(service: str, code: str, message: str, status: int) -> Response:
    """The error body each protocol uses, so botocore parses code and message as from real AWS."""
    if service == "ec2":
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>inj</RequestID></Response>"
        )
        return Response(status, {"Content-Type": "text/xml"}, body.encode())
    if service in QUERY_SERVICES:
        body = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
            "</Error><RequestId>inj</RequestId></ErrorResponse>"
        )
        return Response(status, {"Content-Type": "text/xml"}, body.encode())
    if service == "s3":
        body = f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>inj</RequestId></Error>"
        return Response(status, {"Content-Type": "application/xml"}, body.encode())
    body = json.dumps({"__type": code, "message": message}).encode()
    return Response(status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-ErrorType": code}, body)


class FaultProxy:
    """Reverse proxy on 127.0.0.1 in front of moto; rules are consulted in the order they were added."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # headers and body go out in two writes: without this, Nagle + delayed ACK add 40 ms a call
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                resp = proxy.handle(self.command, self.path, dict(self.headers.items()), body)
                self.send_response(resp.status)
                for k, v in resp.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                self.wfile.write(resp.body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self._lock:
            self.rules.clear()
            self.log.clear()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail(
        self,
        service: str,
        action: str,
        code: str,
        *,
        status: int = 400,
        times: int | None = 1,
        when: Callable[[Request], bool] = lambda r: True,
        message: str = "injected",
    ) -> Rule:
        """Answer matching requests with an AWS error (`times` of them, or while `when` holds)."""
        err = error_response(service, code, message, status)
        return self.add(Rule(service, action, lambda req, fwd: err, when=when, times=times))

    def calls(self, service: str, action: str) -> int:
        return sum(1 for r in self.log if (r.service, r.action) == (service, action))

    @staticmethod
    def parse(method: str, path: str, headers: dict[str, str], body: bytes) -> Request:
        lower = {k.lower(): v for k, v in headers.items()}
        m = re.search(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/", lower.get("authorization", ""))
        service = m.group(1) if m else ""
        params: dict[str, str] = {}
        action = ""
        if "x-amz-target" in lower:
            action = lower["x-amz-target"].rsplit(".", 1)[-1]
            try:
                params = json.loads(body or b"{}")
            except ValueError:
                params = {}
        elif "/operation/" in path:
            action = path.rsplit("/operation/", 1)[1]
        elif lower.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            params = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
            action = params.get("Action", "")
        return Request(method, path, headers, body, service, action, params)

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            r = conn.getresponse()
            return Response(r.status, dict(r.getheaders()), r.read())
        finally:
            conn.close()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        req = self.parse(method, path, headers, body)

        def fwd() -> Response:
            return self.forward(method, path, headers, body)

        with self._lock:
            self.log.append(req)
            rule = next((r for r in self.rules if r.matches(req)), None)
            if rule is not None:
                rule.hits += 1
        return rule.respond(req, fwd) if rule else fwd()


@dataclass
class LocalAws:
    """moto on 127.0.0.1 (ephemeral port) and the fault proxy in front of it."""

    moto: ThreadedMotoServer
    proxy: FaultProxy
    moto_url: str
    direct: FaultProxy
    """A rule-free pass-through for seeding and inspecting (werkzeug answers keep-alive clients slowly)."""
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls) -> LocalAws:
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        proxy, direct = FaultProxy((host, port)), FaultProxy((host, port))
        proxy.start()
        direct.start()
        return cls(moto=moto, proxy=proxy, moto_url=f"http://{host}:{port}", direct=direct)

    def reset(self) -> None:
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=30)
        conn.request("POST", "/moto-api/reset")
        conn.getresponse().read()
        conn.close()
        self.proxy.reset()

    def post_moto_api(self, path: str, payload: dict) -> int:
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=30)
        conn.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        return status

    def stop(self) -> None:
        self.proxy.stop()
        self.direct.stop()
        self.moto.stop()
