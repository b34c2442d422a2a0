"""Safe teardown of everything the kit owns (`python -m ops.teardown`); order lives in `registry.py`."""
