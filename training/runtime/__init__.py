"""Process plumbing the resilience API and the launcher both use; neither imports the other.

- `events`: the run's JSON-lines events (every metric comes from them); `telemetry/`: live metric records;
- `distributed`: the process group and its store; `torch_internals`: every private torch name, checked;
  `efa`: proof that NCCL runs over EFA; `pod`: this pod's processes (the node-level faults, a drain);
  `process_exit`: leave a process without the interpreter's teardown;
- the launcher's channel to its workers: `heartbeat` (beats and phases), `hang_interrupt` (the launcher
  interrupts a hung rank), `stacks` (a rank's stacks on request), `error_file` (torchelastic's error file,
  written atomically), `eviction` (a rank asks its launcher to evict this node).
"""
