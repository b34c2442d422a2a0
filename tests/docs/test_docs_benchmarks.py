"""bench.run_all's merge of the parts' sections into docs/benchmarks.md (no benchmark is run here)."""

from __future__ import annotations

from pathlib import Path

from bench import run_all


def test_merge_keeps_sections_runs_machine_and_marks_anchors_as_theirs(tmp_path: Path) -> None:
    sections = tmp_path / "sections"
    sections.mkdir()
    (sections / "b-recovery.md").write_text(
        "## Recovery\n\nCommand: `python -m bench.recovery`\n", encoding="utf-8"
    )
    (sections / "a-checkpoint.md").write_text("## Checkpoints\n\nstall 0.01 s\n", encoding="utf-8")
    run = run_all.BenchRun(
        name="checkpoint",
        command="python -m bench.checkpoint",
        returncode=0,
        wall_s=61.2,
        result="RESULT stall_ratio=0.01 efficiency=0.995",
    )
    text = run_all.render([run], quick=False, sections_dir=sections)

    assert text.index("## Checkpoints") < text.index("## Recovery")  # sections in file-name order
    assert (
        "| checkpoint | `python -m bench.checkpoint` | 0 | 61 s | stall_ratio=0.01 efficiency=0.995 |" in text
    )
    assert "| cores |" in text and "| torch |" in text
    assert run_all.ANCHORS.strip() in text


def test_discover_finds_modules_with_a_main_block(tmp_path: Path) -> None:
    (tmp_path / "alpha.py").write_text('def main():\n    pass\n\nif __name__ == "__main__":\n    main()\n')
    (tmp_path / "helpers.py").write_text("X = 1\n")
    (tmp_path / "run_all.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert run_all.discover(tmp_path) == ["alpha"]


def test_unknown_benchmark_is_a_one_line_error(capsys) -> None:
    assert run_all.main(["--only", "no-such-bench", "--merge-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no benchmark named no-such-bench") and len(err.strip().splitlines()) == 1
