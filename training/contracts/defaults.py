"""The trainer defaults that `make train-job` reasons about before any pod runs, decided here once.

k8s reads them to check an elastic job's node counts (the micro-batch splits the global batch) and to plan a
job's checkpoint interval; the trainer's config sections take their defaults from the same names.
"""

from __future__ import annotations

MICRO_BATCH = 4
"""data.batch_size: samples per rank per forward and backward."""
CHECKPOINT_INTERVAL = 100
"""checkpoint.interval: steps between saves, where nothing else is chosen (CPU runs, tests, the local
profile). The GPU profiles' Jobs render `auto` instead (fsdpkit.k8s.profiles): Young/Daly from the run's own
measurements, what the plan would pick, where a fixed 100 steps costs a large job goodput."""
