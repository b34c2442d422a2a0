"""The training side of the kit, in floors; each imports only the floors below it (tools/import_rules.py).

    trainer/    analysis/      the kit's own trainer and data tools | metrics, report, ledger from the events
    resilience/ launcher/      THE PUBLIC API a training script imports | the heartbeat launcher (a program)
    runtime/                   process plumbing both sides use: events, process groups, torch internals,
                               the pod, and the launcher's channel to its workers (heartbeat, stacks, ...)
    contracts/                 the vocabulary every part shares, standard library only: env names, exit
                               codes, the run folder, the metric catalog, model shapes, the batch rule

A training script imports `fsdpkit.resilience` (docs/own-model.md) and runs under `python -m
fsdpkit.launcher`. infra/, k8s/ and ops/ import only `fsdpkit.contracts`; nothing here imports AWS or CDK.
"""
