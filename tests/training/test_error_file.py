"""The trainer's torchelastic error file is whole JSON or absent (the launcher's reader raises otherwise)."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure, record

from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.error_file import (
    TORCH_ERRORS_LOGGER,
    AtomicErrorHandler,
    held_parse_failures,
    set_aside_if_torn,
)


def test_the_handler_marks_its_override_of_torchs_private_method_and_start_up_checks_it() -> None:
    """Renamed by torch, the override would never be called and the file written in place again: the
    start-up check (tests/training/test_torch_internals.py breaks it) covers this class on every process."""
    assert getattr(AtomicErrorHandler._get_error_file_path, "__override__", False)
    assert AtomicErrorHandler in internals.OWN_OVERRIDES
    assert internals.override_problems(AtomicErrorHandler) == []


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


@pytest.mark.parametrize(
    "content",
    [b"", b'{"message": {"message": "Run', b"\xff\xfe", b"[1, 2]", b'{"timestamp": 1}', b"null"],
    ids=["empty", "truncated", "not-utf8", "a-list", "no-message", "null"],
)
def test_the_launcher_moves_a_torn_error_file_aside_and_torch_then_reads_the_exit_code(
    tmp_path: Path, content: bytes
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    target = tmp_path / "error.json"
    target.write_bytes(content)
    with pytest.raises(Exception):  # noqa: B017 - what the launcher would crash on, whatever torch raises
        ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(target))
    assert set_aside_if_torn(str(target)) == f"moved to {target}.torn"
    assert not target.exists() and (tmp_path / "error.json.torn").read_bytes() == content
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(target))
    assert failure.exitcode == 3 and failure.message  # torch's own wording for a rank with no error file


def test_a_whole_error_file_or_none_is_left_as_it_is(monkeypatch, tmp_path: Path) -> None:
    target = tmp_path / "error.json"
    assert set_aside_if_torn(str(target)) is None
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))

    @functools.partial(record, error_handler=AtomicErrorHandler())
    def fails() -> None:
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError):
        fails()
    written = target.read_bytes()
    assert set_aside_if_torn(str(target)) is None and target.read_bytes() == written


def test_torchs_traceback_for_a_torn_file_is_held_then_dropped_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """torch logs a traceback, then raises, when it reads a torn file; the launcher holds the record while it
    polls: dropped once it set the file aside (its own line says so), logged as torch wrote it otherwise."""
    torn = tmp_path / "error.json"
    torn.write_text('{"message": {"message": "Runtime')
    caplog.set_level(logging.ERROR, logger=TORCH_ERRORS_LOGGER)
    with held_parse_failures() as held:
        with pytest.raises(ValueError):
            ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(torn))
        assert len(held.records) == 1
        held.drop()
    assert "Failed to parse reply file" not in caplog.text
    with pytest.raises(ValueError), held_parse_failures():
        ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(torn))
    assert "Failed to parse reply file" in caplog.text and "Traceback" in caplog.text
    assert not logging.getLogger(TORCH_ERRORS_LOGGER).filters  # removed either way
