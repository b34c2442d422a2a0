"""The node agent: the one process of a trainer pod that holds a Kubernetes API token, so the ranks never do.

Kubernetes runs it as a native sidecar of the trainer pod (an init container with `restartPolicy: Always`,
k8s/security.py) when STRAGGLER_POLICY=replace with SPARES may cordon a slow node. The pod mounts no
service-account token (`automountServiceAccountToken: false`); only this container mounts a projected,
pod-bound one. The launcher (`NodeActions`, same container as the ranks) leaves a request in the emptyDir
both containers share (KIT_NODE_AGENT_DIR); the agent patches its own Node (`mark_straggler_node`: the kit's
label, annotation and `unschedulable`, nothing else) and answers with the one line the launcher logs. What
the token may do is narrowed again on the API server: a ValidatingAdmissionPolicy admits the patch only on
the node named in the token's node-name claim and only for those three fields.

    python -m fsdpkit.launcher.node_agent --folder /var/run/fsdpkit/node-agent

Standard library only; it polls the folder (POLL_S) and stops on SIGTERM (after the trainer container
ended: a native sidecar is stopped last).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from fsdpkit.launcher.node_actions import (
    NODE_NAME_ENV,
    REQUEST_PREFIX,
    RESULT_PREFIX,
    SA_DIR,
    TIMEOUT_S,
    NodeMark,
    mark_straggler_node,
    write_json,
)

POLL_S = 0.5
"""Seconds between two looks at the folder: a cordon is rare and may wait this long."""
REASON_MAX = 1024
"""Longest annotation the agent writes (a rank's reason is cut there: the Node object stays small)."""

log = logging.getLogger("kit.node_agent")


def handle_pending(
    folder: Path, *, env: Mapping[str, str], sa_dir: Path = SA_DIR, timeout_s: float = TIMEOUT_S
) -> int:
    """Answer every request in `folder` (one at a time: a cordon is rare); returns how many were answered."""
    answered = 0
    for request in sorted(folder.glob(f"{REQUEST_PREFIX}*.json")):
        ident = request.name[len(REQUEST_PREFIX) : -len(".json")]
        try:
            reason = str(json.loads(request.read_text(encoding="utf-8"))["reason"])[:REASON_MAX]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            node = env.get(NODE_NAME_ENV) or None
            mark = NodeMark(False, node, f"node not cordoned: {request.name} is not a cordon request ({exc})")
        else:
            mark = mark_straggler_node(reason, env=env, sa_dir=sa_dir, timeout_s=timeout_s)
        log.warning("kit-node-agent: %s", mark.line)
        write_json(folder / f"{RESULT_PREFIX}{ident}.json", {"cordoned": mark.cordoned, "node": mark.node,
                                                             "line": mark.line})  # fmt: skip
        request.unlink(missing_ok=True)
        answered += 1
    return answered


def serve(
    folder: Path,
    *,
    env: Mapping[str, str],
    stop: threading.Event,
    sa_dir: Path = SA_DIR,
    poll_s: float = POLL_S,
) -> None:
    """Answer requests until `stop` is set."""
    while not stop.is_set():
        handle_pending(folder, env=env, sa_dir=sa_dir)
        stop.wait(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fsdpkit.launcher.node_agent", description=__doc__)
    parser.add_argument("--folder", type=Path, required=True, help="the emptyDir shared with the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if not args.folder.is_dir():
        print(
            f"error: --folder {args.folder}: not a folder; mount the node-agent emptyDir there",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serve(args.folder, env=os.environ, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
