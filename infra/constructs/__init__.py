"""One construct per concern. Each takes its config slice and its dependencies as typed arguments."""
