"""`make demo`: the newcomer's first run, offline, on CPU, in a few minutes (see demo/run.py)."""
