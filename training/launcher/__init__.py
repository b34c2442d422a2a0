"""The heartbeat launcher, a program of its own (`python -m fsdpkit.launcher`, torchrun's flag names).

`cli` parses and checks the flags (`args`), `runner` builds torch's WorkerSpec around `agent`
(KitElasticAgent: torchelastic's agent with three hooks, each handing its work to a collaborator: `exits`,
`failures`, `node_failures`, `hang` with `monitor`, `activity` and `blame`, `lifecycle`, `budget`), the
`zygote` forks warm workers through `shim`, `rendezvous/` forms the rounds (the kit's backend and the c10d
adapter, with hot spares), `store` runs the rendezvous store, and `node_actions` is the only code that acts
on a Kubernetes node (a straggler's cordon, then its drain).
"""
