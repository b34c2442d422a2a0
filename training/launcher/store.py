"""The job's rendezvous store, in a pod of its own: `python -m fsdpkit.launcher.store --port P`.

torchelastic's c10d rendezvous keeps its state in a TCPStore that, by default, the agent on the endpoint's
host serves (pod 0): lose pod 0's node and every launcher loses the rendezvous. Here a small process that
trains nothing serves it instead (a Deployment on the system node group behind its own Service, rendered by
k8s/; the local runner starts it as its own pod), and every agent is a client (`--rdzv-conf is_host=0`).

If the store itself restarts, its state is gone; with the kit's rendezvous (training/launcher/rendezvous/)
every node reconnects and publishes its state again, and training goes on (the workers' own store lives in
the group's rank-0 worker). With torch's c10d handler every agent's next call fails, the workers drain and
the Job replaces the pods. See docs/launcher.md.

`--host 127.0.0.1` (the local runner) listens on the loopback address only (TCPStore alone would listen on
every interface: fsdpkit.runtime.store_server.serve_store); on EKS it listens on the pod's every interface,
behind the run's NetworkPolicy. The store checks no client itself (TCPStore cannot): the kit's clients seal
what they write with the run's token and ignore what they cannot check (fsdpkit.runtime.run_token).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from datetime import timedelta

from fsdpkit.contracts.cliargs import OneLineParser, int_arg

PARENT_POLL_S = 1.0
"""How often a store started with --exit-with-parent looks for its parent."""


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m fsdpkit.launcher.store", description=__doc__.splitlines()[0])
    p.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (default all; 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int_arg(lo=1, hi=65535), required=True, help="TCP port")
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one is gone (the local runner's store pod: a runner "
        "killed outright must not leave its store serving)",
    )
    args: argparse.Namespace = p.parse_args(sys.argv[1:] if argv is None else argv)
    from fsdpkit.runtime.store_server import serve_store

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        store = serve_store(args.host, args.port, timeout=timedelta(seconds=60))
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"kit-store: error: cannot serve {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"kit-store: serving the rendezvous on {args.host}:{args.port}", flush=True)
    parent = os.getppid()
    while not stop.wait(PARENT_POLL_S):
        if args.exit_with_parent and os.getppid() != parent:
            print("kit-store: the process that started it is gone; stopping", flush=True)
            break
    del store
    print("kit-store: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
