"""One node of the kit's rendezvous as the agent drives it, in a process of its own (so that a test can lose
it the way a host is lost: SIGSTOP, SIGKILL): join, then check membership every 0.1 s and re-join when a node
waits. Prints one JSON line per completed round: {"round", "rank", "world"}.

`python tests/training/rdzv_node.py HOST:PORT RUN_ID NODES [spare]`
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from fsdpkit.launcher.rendezvous import KitRendezvous, Settings, StoreLink

LIFETIME_S = 300.0
"""A node left behind by its test (whose limit is 120 s) ends by itself."""


def main() -> int:
    endpoint, run_id, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    host, port = endpoint.rsplit(":", 1)
    spare = "spare" in sys.argv[4:]
    end = time.monotonic() + LIFETIME_S
    handler = KitRendezvous(
        StoreLink(host, int(port), is_host=False), Settings(run_id, nodes, nodes, spare=spare)
    )
    while True:
        try:
            info = handler.next_rendezvous()
        except RendezvousGracefulExitError:
            print(json.dumps({"exit": "graceful"}), flush=True)
            return 0
        print(json.dumps({"round": handler.round, "rank": info.rank, "world": info.world_size}), flush=True)
        while handler.num_nodes_waiting() == 0:
            if handler.is_closed():
                return 0
            if time.monotonic() > end:
                print(json.dumps({"exit": f"ended itself after {LIFETIME_S:g} s"}), flush=True)
                return 1
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
