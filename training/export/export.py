"""One export, start to end: check the output, read `--config`, pick and verify the step, name the tensors,
plan the files, then stream every tensor into a staging folder beside OUT and move it in.

Nothing is written into OUT until the whole folder is ready: the staging folder (in OUT's parent, so the
move is a rename) gets the weights, the index, the tokenizer files and config.json last; a refusal or a
failure midway leaves OUT as it was. OUT must be new or empty; with `force`, an existing OUT keeps its
other files and loses its old weights (model*.safetensors and the index), which would mix with the new.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fsdpkit.contracts.cliargs import output_folder_problem
from fsdpkit.contracts.hf_config import CONFIG, HfModelError, check_tokenizer
from fsdpkit.export import dcp_read, hf_source, kit_llama, safetensors_out, steps
from fsdpkit.export.errors import ExportError
from fsdpkit.export.safetensors_out import INDEX_FILE, OutTensor, ShardFile
from fsdpkit.export.stream import Scratch, copy_tensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""--dtype -> the dtype floating tensors are written in."""
DEFAULT_MAX_SHARD = 5 * 10**9
"""`save_pretrained`'s max_shard_size of transformers 4.x, "5GB"."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""What a Hugging Face tokenizer folder may hold; those present are copied."""
_STALE = ("model.safetensors", INDEX_FILE)
_SPACE_MARGIN = 16 << 20


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    run: Path
    """The run folder (or its checkpoints/ folder, or one step_<N> folder)."""
    out: Path
    step: int | None = None
    """The step to export; None: the newest commit that verifies."""
    config: Path | None = None
    """The Hugging Face model folder the run trained from (a model of its own parameter names)."""
    model: str | None = None
    """The kit Llama's shape name; None: the one the checkpoint matches."""
    tokenizer: Path | None = None
    """A folder whose tokenizer files are copied; None: the --config folder's, if any."""
    dtype: str = "float32"
    max_shard_bytes: int = DEFAULT_MAX_SHARD
    force: bool = False
    checksum: bool = True
    """Verify every file's checksum (else sizes only)."""
    piece_bytes: int = dcp_read.PIECE_BYTES


@dataclass(frozen=True, kw_only=True)
class ExportSummary:
    step: int
    source: str
    """What was exported, in words."""
    out: Path
    files: list[str]
    tensors: int
    bytes: int
    """Tensor bytes written."""
    checkpoint_bytes: int
    """The step's files on disk (model, optimizer and the rest)."""
    dtype: str
    verify_s: float
    write_s: float
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def line(self) -> str:
        weights = [f for f in self.files if f.endswith(".safetensors")]
        return (
            f"exported step {self.step} ({self.source}) to {self.out}: {self.tensors} tensors, "
            f"{self.bytes / 1e6:.1f} MB of {self.dtype} in {len(weights)} file(s); checkpoint verified in "
            f"{self.verify_s:.1f} s, weights written in {self.write_s:.1f} s"
        )


def check_output(out: Path, *, force: bool) -> None:
    """OUT must be new, or an empty folder (any folder with `force`), and writable."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"OUT {str(out)!r} is a file, not a folder: pick a new or empty folder")
    if out.is_dir() and not force:
        try:
            busy = next(iter(out.iterdir()), None) is not None
        except OSError as exc:
            raise ExportError(
                f"OUT {str(out)!r} cannot be read ({exc.strerror}): pick a folder you can write"
            ) from None
        if busy:
            raise ExportError(
                f"OUT {str(out)!r} exists and is not empty: pick a new or empty folder, or pass --force to "
                "replace the model files in it"
            )
    if problem := output_folder_problem(out, "OUT"):
        raise ExportError(problem)


def tokenizer_files(req: ExportRequest) -> list[Path]:
    """The tokenizer files to copy: --tokenizer's (which must hold some), else the --config folder's."""
    folder = req.tokenizer if req.tokenizer is not None else req.config
    if folder is None:
        return []
    if req.tokenizer is not None:
        if not folder.exists():
            raise ExportError(
                f"--tokenizer {str(folder)!r} does not exist: give the folder holding tokenizer.json"
            )
        if not folder.is_dir():
            raise ExportError(f"--tokenizer {str(folder)!r} is a file: give the folder that holds it")
    found = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if req.tokenizer is not None and not found:
        raise ExportError(
            f"--tokenizer {str(folder)!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:5])}, ...)"
        )
    return found


def _check_tokenizer(files: list[Path], config: dict[str, Any]) -> None:
    """A tokenizer.json whose ids reach past the model's embedding is refused (when `tokenizers` is there)."""
    path = next((f for f in files if f.name == "tokenizer.json"), None)
    if path is None:
        return
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size(True)
    except Exception as exc:  # the tokenizers library's own errors: not a file it reads
        raise ExportError(f"{path} is not a tokenizer.json the tokenizers library reads: {exc}") from None
    try:
        check_tokenizer(size, config)
    except HfModelError as exc:
        raise ExportError(f"{path}: {exc}") from None


def _named(
    req: ExportRequest, hf: hf_source.HfModel | None, tensors: list[dcp_read.StoredTensor]
) -> tuple[list[tuple[str, dcp_read.StoredTensor]], dict[str, Any], str, list[Path]]:
    """(file name, tensor) pairs, config.json, the source in words, extra files: by the model's kind."""
    if hf is not None and kit_llama.is_kit_checkpoint(tensors):
        raise ExportError(
            f"the checkpoint holds the kit's own Llama ({kit_llama.MARKER}, ...), not the model of "
            f"{hf.folder}: drop --config (the export writes the Llama config.json itself)"
        )
    if hf is not None:
        return (
            hf.names(tensors),
            hf.written_config(req.dtype),
            f"{hf.architecture} of {hf.folder}",
            hf.extra_files(),
        )
    if kit_llama.is_kit_checkpoint(tensors):
        shape, named = kit_llama.plan(tensors, req.model)
        config = kit_llama.llama_config(shape.args, req.dtype)
        return named, config, f"the kit's Llama {shape.name} as LlamaForCausalLM", []
    first = ", ".join(t.name for t in tensors[:2])
    raise ExportError(
        f"the checkpoint holds a model of its own parameter names ({first}, ...): pass --config MODEL_DIR, "
        "the Hugging Face folder the run trained from"
    )


def _check_space(out: Path, shards: list[ShardFile]) -> None:
    need = sum(s.size for s in shards) + _SPACE_MARGIN
    anchor = out.absolute().parent
    while not anchor.exists():
        anchor = anchor.parent
    free = shutil.disk_usage(anchor).free
    if free < need:
        raise ExportError(
            f"{anchor} has {free / 1e9:.2f} GB free, the export needs {need / 1e9:.2f} GB: free space or "
            "pick another OUT"
        )


def _staging(out: Path) -> Path:
    try:
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.absolute().parent))
        (staging / "out").mkdir()  # the usual permissions (mkdtemp's are 0700)
    except OSError as exc:
        raise ExportError(
            f"cannot write OUT {str(out)!r}: {exc.strerror}; pick a folder you can write"
        ) from None
    return staging


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _move_in(folder: Path, out: Path) -> None:
    """`folder` becomes OUT (a rename when OUT is new or empty), or its files replace OUT's (config.json
    last, after the old weights are gone)."""
    if out.is_dir() and next(iter(out.iterdir()), None) is None:
        out.rmdir()
    if not out.exists():
        folder.rename(out)
        return
    for stale in [*(out / name for name in _STALE), *out.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    for path in sorted(folder.iterdir(), key=lambda p: p.name == CONFIG):
        os.replace(path, out / path.name)


def _fsync_folder(folder: Path) -> None:
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write(
    req: ExportRequest,
    chosen: steps.Chosen,
    shards: list[ShardFile],
    folder: Path,
    progress: Callable[[str], None],
) -> None:
    """Every shard file, streamed tensor by tensor from the step's rank files; `progress` hears each file
    of several. One torch thread: a piece converts in milliseconds, less than a thread pool's wake-up, and
    on a busy machine torch's spinning threads made the conversion ten times slower (3.3 GB/s fp32 -> bf16
    on one thread here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scratch = Scratch()
        with dcp_read.ChunkReader(chosen.folder, piece_bytes=req.piece_bytes) as reader:

            def copy(fd: int, t: OutTensor) -> int:
                return copy_tensor(
                    fd,
                    reader,
                    t.source,
                    t.dtype,
                    step=chosen.step,
                    piece_bytes=req.piece_bytes,
                    scratch=scratch,
                )

            for i, shard in enumerate(shards, start=1):
                safetensors_out.write_shard(folder / shard.name, shard, copy)
                if len(shards) > 1:
                    progress(f"wrote {shard.name} ({shard.size / 1e9:.2f} GB, {i} of {len(shards)})")
    finally:
        torch.set_num_threads(threads)


def _preflight(req: ExportRequest) -> tuple[hf_source.HfModel | None, list[Path]]:
    """Everything that can be refused before the checkpoint is read: the options, OUT, --config (built on
    the meta device), the tokenizer folder."""
    if req.dtype not in DTYPES:
        raise ExportError(f"--dtype {req.dtype!r}: one of {', '.join(DTYPES)}")
    if req.max_shard_bytes < 1:
        raise ExportError(f"--max-shard-size {req.max_shard_bytes}: must be at least 1 byte")
    check_output(req.out, force=req.force)
    root, _ = steps.checkpoint_root(req.run)
    if req.out.resolve().is_relative_to(root.resolve()):
        raise ExportError(
            f"OUT {str(req.out)!r} is inside {root}, whose old steps the run deletes: pick a folder outside "
            "checkpoints/"
        )
    hf = hf_source.read_model(req.config) if req.config is not None else None
    return hf, tokenizer_files(req)


def export_hf(
    req: ExportRequest,
    *,
    warn: Callable[[str], None] = lambda line: None,
    progress: Callable[[str], None] = lambda line: None,
) -> ExportSummary:
    """Export `req.run`'s checkpoint to `req.out` (module docstring); ExportError (one line) on refusal.
    `warn` hears each newer step skipped, `progress` each weights file written (when there are several)."""
    hf, tokenizer = _preflight(req)
    t0 = time.perf_counter()
    chosen = steps.choose(req.run, req.step, checksum=req.checksum, warn=warn)
    verify_s = time.perf_counter() - t0
    tensors = dcp_read.model_tensors(chosen.folder)
    if req.model is not None and not kit_llama.is_kit_checkpoint(tensors):
        raise ExportError(
            f"--model {req.model} names a shape of the kit's own Llama; this checkpoint holds "
            "another model: pass --config MODEL_DIR instead"
        )
    named, config, source, extra = _named(req, hf, tensors)
    asked = DTYPES[req.dtype]
    outs = [OutTensor(name, t, safetensors_out.out_dtype(t.dtype, asked)) for name, t in named]
    shards = safetensors_out.plan(outs, req.max_shard_bytes)
    _check_tokenizer(tokenizer, config)
    _check_space(req.out, shards)
    staging = _staging(req.out)
    t1 = time.perf_counter()
    try:
        folder = staging / "out"
        _write(req, chosen, shards, folder, progress)
        if (doc := safetensors_out.index(shards)) is not None:
            _write_json(folder / INDEX_FILE, doc)
        for path in [*extra, *tokenizer]:
            shutil.copyfile(path, folder / path.name)
        _write_json(folder / CONFIG, config)
        _fsync_folder(folder)
        written = sorted(p.name for p in folder.iterdir())
        _move_in(folder, req.out)
    except OSError as exc:
        raise ExportError(f"writing OUT {str(req.out)!r} failed: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportSummary(
        step=chosen.step,
        source=source,
        out=req.out,
        files=written,
        tensors=len(outs),
        bytes=sum(t.nbytes for t in outs),
        checkpoint_bytes=chosen.record.total_bytes,
        dtype=req.dtype,
        verify_s=verify_s,
        write_s=time.perf_counter() - t1,
        skipped=chosen.skipped,
    )
