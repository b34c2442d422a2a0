"""torchelastic's error file, written atomically (temp file, then rename).

The launcher reads a failed rank's error file (TORCHELASTIC_ERROR_FILE) as soon as the rank has exited, and
torch's reader (`ProcessFailure`) raises on a file that is not whole JSON, which crashes the launcher. A rank
that the launcher stops while it is recording its exception (a peer was killed, the group is torn down)
left the file created but empty: seen once in `make test` (2026-12-02, the save-phase kill test). With the
rename, the file is either absent or complete.
"""

from __future__ import annotations

import contextlib
import os

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

_PARTIAL = ".partial"


class AtomicErrorHandler(ErrorHandler):
    """torch's ErrorHandler, whose `record_exception` writes next to the file and then renames it in place."""

    def _get_error_file_path(self) -> str | None:
        path = super()._get_error_file_path()
        return None if path is None else path + _PARTIAL

    def record_exception(self, e: BaseException) -> None:
        super().record_exception(e)
        partial = self._get_error_file_path()
        if partial is not None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(partial, partial[: -len(_PARTIAL)])
