"""The trainer's torchelastic error file is whole JSON or absent (the launcher's reader raises otherwise)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import record

from training.error_file import AtomicErrorHandler


def test_a_recorded_exception_lands_whole_under_the_launchers_name(monkeypatch, tmp_path: Path) -> None:
    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))

    @functools.partial(record, error_handler=AtomicErrorHandler())
    def fails() -> None:
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        fails()
    assert json.loads(target.read_text())["message"]["message"] == "RuntimeError: peer gone"
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"], "no partial file left behind"
