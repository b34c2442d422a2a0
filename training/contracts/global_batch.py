"""The global-batch rule the trainer and `make train-job` share: a world size keeps a global batch (samples
per optimizer step over all ranks) exactly when it splits it into whole micro-batches on every rank. The
trainer refuses any other size before a process group (training/resilience/batch.py, `plan_batch`); k8s
refuses an elastic job that could shrink to one (k8s/elastic.py). Standard library only.
"""

from __future__ import annotations

MAX_LISTED = 12
"""World sizes named in a refusal, at most."""


def world_sizes_keeping(global_batch: int, micro_batch: int) -> list[int]:
    """Every world size that splits `global_batch` exactly into micro-batches of `micro_batch`."""
    if global_batch % micro_batch:
        return []
    per = global_batch // micro_batch
    small = [w for w in range(1, int(per**0.5) + 1) if per % w == 0]
    return sorted(set(small) | {per // w for w in small})


def default_global_batch(micro_batch: int, accum: int, world_size: int) -> int:
    """The global batch a job declares without training.global_batch (and without a checkpoint that declares
    one): what its ranks compute per optimizer step."""
    return micro_batch * accum * world_size


def refusal(global_batch: int, micro_batch: int, world_size: int, source: str, *, kept: bool = False) -> str:
    """The one line that refuses a world size which cannot keep `global_batch` exactly; `kept`: the batch is
    a checkpoint's (another batch would not resume it: the fixes are the sizes, or a new run)."""
    sizes = world_sizes_keeping(global_batch, micro_batch)
    multiple = micro_batch * world_size
    fix = "use a new run.id" if kept else f"set training.global_batch to a multiple of {multiple}"
    if not sizes:
        return (
            f"the global batch {global_batch} ({source}) is not a multiple of the micro-batch {micro_batch}: "
            f"{fix}"
        )
    listed = ", ".join(map(str, sizes[:MAX_LISTED])) + (", ..." if len(sizes) > MAX_LISTED else "")
    return (
        f"the global batch {global_batch} ({source}) cannot be split exactly over {world_size} rank(s) of "
        f"{micro_batch} samples: run on {listed} rank(s), or {fix}"
    )
