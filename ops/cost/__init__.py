"""Cost report parts: Cost Explorer spend, live burn rate, fault/stall cost, and rendering."""
