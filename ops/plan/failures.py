"""Failure rates per node-hour by the class of recovery they need, from published fleet data (each with its
source), or the user's own.

The default is Llama 3's pre-training on 16,384 H100s (2,048 nodes of 8) for 54 days: 466 job interruptions,
419 unexpected and 47 planned ("The Llama 3 Herd of Models", Meta, 2024, section 3.3.4 and Table 5). Table 5's
unexpected root causes are mapped to the recovery each one needs from the kit:

  soft   software bug 54, NCCL watchdog timeout 7, dependency 2 (63): the process survives the fault; an
         in-process restart recovers it
  node   faulty GPU 148, GPU HBM3 72, network switch/cable 35, GPU SRAM 19, GPU system processor 17, NIC 7,
         silent data corruption 6, GPU thermal interface and sensor 6, SSD 3, power supply 3, server chassis
         2, IO expansion board 2, CPU 2, system memory 2 (324): the node must be replaced
  drain  host maintenance 32, plus the 47 planned interruptions (79): the job is told first (SIGTERM)

Exposure: 54 days x 24 h x 2,048 nodes = 2,654,208 node-hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

FailureClass = Literal["soft", "node", "drain"]
FAILURE_CLASSES: tuple[FailureClass, ...] = ("soft", "node", "drain")
LLAMA3_NODE_HOURS = 54 * 24 * 2048
LLAMA3_SOURCE = "Llama 3 (Meta 2024), 54 days on 2,048 H100 nodes, Table 5"


class PlanInputError(ValueError):
    """An input the plan cannot use; one line that names it and says what to give."""


@dataclass(frozen=True, kw_only=True)
class FailureRates:
    """Faults per node-hour of each class, and where the figures come from."""

    soft: float
    node: float
    drain: float
    source: str

    def __post_init__(self) -> None:
        for name in FAILURE_CLASSES:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise PlanInputError(
                    f"failure rate {name}={value!r}: give a finite number of faults per node-hour >= 0"
                )
        if self.soft + self.node + self.drain <= 0:
            raise PlanInputError(
                "failure rates are all 0: give at least one rate above 0 (faults per node-hour)"
            )

    def of(self, cls: FailureClass) -> float:
        return float(getattr(self, cls))

    @property
    def total(self) -> float:
        return self.soft + self.node + self.drain

    def node_mtbf_h(self) -> float:
        """Hours between faults of one node, any class."""
        return 1.0 / self.total


LLAMA3 = FailureRates(
    soft=63 / LLAMA3_NODE_HOURS,
    node=324 / LLAMA3_NODE_HOURS,
    drain=79 / LLAMA3_NODE_HOURS,
    source=LLAMA3_SOURCE,
)
"""The default: 466 interruptions over 2,654,208 node-hours (a node fails about every 5,700 hours; a
2,048-node job about every 2.8 hours)."""
