"""Safe teardown of everything the kit owns (`python -m fsdpkit.ops.teardown`); order lives in
`registry.py`."""
