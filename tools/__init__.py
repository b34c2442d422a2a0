"""Developer tools that generate documentation from the code (so the docs cannot drift)."""
