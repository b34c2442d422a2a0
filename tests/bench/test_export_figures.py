"""bench.export's figures and section from measured records (no export is run here: the measured runs are
tests/export/test_export_trained.py's memory test and the benchmark itself)."""

from __future__ import annotations

import math
from pathlib import Path

from bench.export import kit_shapes, result_line, write_doc
from fsdpkit.contracts.shapes import MODEL_CONFIGS


def test_the_random_checkpoint_has_the_shape_of_the_kits_model() -> None:
    shapes = kit_shapes("small")
    assert sum(math.prod(s) for _, s in shapes) == MODEL_CONFIGS["small"].num_params()
    assert shapes[0] == ("tok_embeddings.weight", (32000, 768))


def test_the_section_names_its_command_and_every_conversion(tmp_path: Path) -> None:
    row = {"bytes": 500e6, "wall_s": 2.0, "verify_s": 0.5, "write_s": 1.5, "peak_growth": 40e6}
    table = {"float32": row, "bfloat16": row | {"bytes": 250e6}, "dcp_to_torch_save": {"wall_s": 4.0,
             "peak_growth": 650e6}}  # fmt: skip
    result = {"export_mb_s": 250.0, "bf16_mb_s": 125.0, "peak_growth_mb": 40.0, "checkpoint_mb": 600.0,
              "peak_ratio": 40 / 600, "dcp_peak_ratio": 650 / 600}  # fmt: skip
    line = result_line(result)
    assert line == (
        "RESULT export_mb_s=250.0 bf16_mb_s=125.0 peak_growth_mb=40.0 checkpoint_mb=600.0 peak_ratio=0.067 "
        "dcp_peak_ratio=1.08"
    )
    doc = tmp_path / "export.md"
    write_doc(doc, result, table, quick=False, load=1.5)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("## Your model back: kit-export-hf throughput and memory (CPU)\n")
    assert "`python -m bench.export`: a committed 2-rank checkpoint" in text
    assert (
        "| kit-export-hf --dtype bfloat16 | 250 MB | 2.00 s | 125 | 0.50 s | 1.50 s | 40.0 MB | 0.067 |"
        in text
    )
    assert "| torch's dcp_to_torch_save (all state) | - | 4.00 s | - | - | - | 650.0 MB | 1.083 |" in text
    assert text.rstrip().endswith(line)
