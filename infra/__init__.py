"""CDK app for the kit: typed config, one construct per concern, stacks that compose them.

`fsdpkit.infra.config.KitConfig` is the validated settings tree read from `cdk.json` context and `-c
key=value`
overrides; `fsdpkit.infra.stacks.build_kit(app, cfg)` builds every stack from it.
"""
