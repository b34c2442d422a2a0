"""torchelastic's error file: written atomically by the kit's trainer, read safely by the kit's launcher.

The launcher reads a failed rank's error file (TORCHELASTIC_ERROR_FILE) as soon as the rank has exited, and
torch's reader (`ProcessFailure`) raises on a file that is not whole JSON, which crashes the launcher. A rank
that the launcher stops while it is recording its exception (a peer was killed, the group is torn down)
left the file created but empty: seen once in `make test` (2026-12-02, the save-phase kill test).
- Trainer side (`AtomicErrorHandler`): with a temp file and a rename, the file is either absent or complete.
- Launcher side (`set_aside_if_torn`): a trainer that is not the kit's (its own `@record`) can still leave a
  torn file; the launcher moves it aside before torch reads it, so the failure is reported by its exit code.
  One that a rank left while torch was already polling is read by torch, which logs a traceback and raises:
  the launcher holds that record (`held_parse_failures`), sets the file aside and polls again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from typing_extensions import override

_PARTIAL = ".partial"


class AtomicErrorHandler(ErrorHandler):
    """torch's ErrorHandler, whose `record_exception` writes next to the file and then renames it in place.
    `_get_error_file_path` is private to torch, so it is declared and checked at start-up in
    training/runtime/torch_internals.py: after a rename torch writes in place, and `super()` here fails."""

    @override
    def _get_error_file_path(self) -> str | None:
        path = super()._get_error_file_path()
        return None if path is None else path + _PARTIAL

    def record_exception(self, e: BaseException) -> None:
        super().record_exception(e)
        partial = self._get_error_file_path()
        if partial is not None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(partial, partial[: -len(_PARTIAL)])


TORN_SUFFIX = ".torn"


def _readable(path: str) -> bool:
    """Whether torch's reader (`ProcessFailure._get_error_data`) can take this file."""
    try:
        with open(path, encoding="utf-8") as fp:
            data = json.load(fp)
        message = data["message"]
        int(data.get("timestamp", 0)) if isinstance(message, str) else int(message["extraInfo"]["timestamp"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def set_aside_if_torn(path: str) -> str | None:
    """Move an error file torch's reader would raise on out of its way and say where ("moved to
    <path>.torn", kept for a look, or "removed"); None when the file is absent or readable. Call it only
    after the rank exited (nothing writes the file any more)."""
    if not os.path.isfile(path) or _readable(path):
        return None
    aside = path + TORN_SUFFIX
    try:
        os.replace(path, aside)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # torch must not read it; a torn file holds nothing to lose
        return "removed"
    return f"moved to {aside}"


TORCH_ERRORS_LOGGER = "torch.distributed.elastic.multiprocessing.errors"
_PARSE_FAILURE = "Failed to parse reply file"


class ParseFailuresHeld(logging.Filter):
    """While installed on torch's errors logger, holds the traceback torch logs before it raises on a torn
    error file. The launcher polls inside `held_parse_failures()`: a file it then sets aside is reported by
    its own one line (`drop()`); anything else is logged as torch wrote it when the block ends."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(_PARSE_FAILURE):
            self.records.append(record)
            return False
        return True

    def drop(self) -> None:
        self.records.clear()


@contextlib.contextmanager
def held_parse_failures() -> Iterator[ParseFailuresHeld]:
    """Hold torch's parse-failure records for the block; those not dropped are logged at its end."""
    logger = logging.getLogger(TORCH_ERRORS_LOGGER)
    held = ParseFailuresHeld()
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)
        for record in held.records:
            logger.handle(record)
