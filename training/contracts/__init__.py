"""What the parts of the kit share, named once: standard library only, so infra, k8s and ops import it
without torch (and nothing else of `training`).

- `env`: every environment variable one part sets for another (the Job for the pod, the launcher for its
  workers); `exitcodes`: what a process's exit status means to the launcher and the Job's failure policy;
- `run_layout`: the run folder's names (checkpoints, commit record, events, metrics);
- `metrics_catalog`, `metrics_settings`: every live metric and where a process sends it;
- `shapes`, `hf_config`, `throughput`: model shapes by name or from a Hugging Face config.json, FLOPs, peaks;
- `global_batch`, `defaults`, `seeds`, `ports`: the global-batch rule, the trainer defaults k8s plans with,
  the seed mixer, free store ports;
- `labels`: the Kubernetes labels k8s renders, infra puts on its own objects and teardown deletes by;
- `cliargs`, `fielddocs`, `extras`: one-line command-line errors, docs from typed fields, a missing extra.
"""
