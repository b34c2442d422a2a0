"""Tokenize text with a Hugging Face tokenizer into token shards: `python -m fsdpkit.data.prepare_data`.

Usage:
  python -m fsdpkit.data.prepare_data --tokenizer PATH/tokenizer.json --out DIR [--text-field text]
      [--split SPLIT] [--split-lines] [--eos-token TOKEN] [--parse-special] [--shard-tokens N] INPUT...

INPUT, read in the order given (the same inputs and tokenizer give the same shard bytes):
  *.txt              UTF-8 text, one document per file (a leading BOM is dropped; the rest is kept exactly);
                     with --split-lines, one document per line that is not blank (the line without its
                     newline, and without the `\\r` of a CRLF ending).
  *.jsonl, *.json    JSON lines: one object per line, the document is its --text-field string (blank
                     lines are skipped). A .json file holding one JSON array is not read: write JSON lines.
  *.parquet          the --text-field column (strings), read in batches with pyarrow.
  FOLDER             a folder written by `datasets`' save_to_disk, column --text-field; a DatasetDict
                     needs --split (plain Dataset folders are read whole). Loaded offline.
Empty documents ("") are skipped and counted. Each document is encoded without the tokenizer's own
special tokens (no BOS; its truncation and padding are turned off) and followed by one EOS id. Special
tokens written in the text are encoded as plain text, so only the appended EOS ends a document;
--parse-special makes them special tokens instead (for text that was formatted with them on purpose).

EOS: --eos-token; else the `eos_token` of a tokenizer_config.json next to tokenizer.json; else the first
of </s>, <|end_of_text|>, <|endoftext|> in the vocab. It must be in the vocab.

Output in --out (new, or a folder without *.bin): shard_00000.bin, ... (the API's format:
fsdpkit.resilience.dataset.format), at most --shard-tokens tokens each (default 1e8; a document may span two
shards). The header holds the vocab size (`get_vocab_size(with_added_tokens=True)`, or the largest id + 1 if
that is larger), uint16 tokens when it is <= 65536 (else uint32), and the tokenizer fingerprint
(`tokenizer_fingerprint`), which `resilience.TokenDataset.check(..., tokenizer_json=)` compares with the
model's tokenizer. prepare.json beside the shards
records the tokenizer, fingerprint, vocab size, EOS, counts and inputs. The shards are written in a
temporary folder next to --out and moved in at the end: a bad input leaves nothing behind.

Bad input (a tokenizer path that is missing, a folder or not a tokenizer.json; a missing input or an
unknown extension; a JSON line that is not JSON or lacks the field; a missing column or split; an --eos-token
not in the vocab; an empty corpus; an --out that is a file or holds shards) is one `error:` line on stderr
and exit 78 (fsdpkit.contracts.exitcodes.FATAL_CONFIG); a bad command line (--shard-tokens 0) exits 2, as
argparse.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.cliargs import OneLineParser, int_arg, program
from fsdpkit.contracts.extras import MissingExtra, require
from fsdpkit.resilience.dataset.format import fingerprint_json, shard_files, write_shard

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def _tokenizers() -> Any:
    """The `tokenizers` library (the hf extra), imported when a tokenizer is first read."""
    return require("tokenizers", extra="hf", needed_by="kit-prepare-data")


EOS_CANDIDATES = ("</s>", "<|end_of_text|>", "<|endoftext|>")
TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
DEFAULT_SHARD_TOKENS = 100_000_000
BATCH_DOCS = 1024
BATCH_CHARS = 8_000_000
"""A batch for encode_batch ends at BATCH_DOCS documents or BATCH_CHARS characters, whichever comes first."""
PARQUET_ROWS = 1024

Kind = Literal["text", "jsonl", "parquet", "datasets"]


class PrepareError(ValueError):
    """Bad input: the message is one line that names the value and the fix."""


@dataclass(frozen=True)
class Source:
    path: Path
    kind: Kind


@dataclass
class InputStats:
    path: str
    kind: Kind
    documents: int = 0
    tokens: int = 0
    empty_skipped: int = 0


@dataclass
class Encoder:
    """A loaded tokenizer and what prepare_data needs of it."""

    tokenizer: Tokenizer
    path: Path
    fingerprint: int
    vocab_size: int
    eos_token: str
    eos_id: int

    def encode(self, docs: list[str]) -> np.ndarray:
        """The documents' ids, each followed by EOS, as one uint32 array."""
        batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        ids = [e.ids for e in batch(docs, add_special_tokens=False)]
        count = sum(map(len, ids)) + len(ids)
        eos = (self.eos_id,)
        flat = itertools.chain.from_iterable(itertools.chain(i, eos) for i in ids)
        return np.fromiter(flat, dtype=np.uint32, count=count)


# --- the tokenizer ------------------------------------------------------------------------------------


def tokenizer_fingerprint(path: str | Path) -> int:
    """`fingerprint_json` of the Hugging Face tokenizer.json at `path`, as the `tokenizers` library reads
    it (so two files that differ only in layout match). Raises what `Tokenizer.from_file` raises."""
    return fingerprint_json(_tokenizers().Tokenizer.from_file(str(path)).to_str())


def load_tokenizer(path: Path, *, eos_token: str | None = None, parse_special: bool = False) -> Encoder:
    """Read tokenizer.json (strictly: UTF-8, JSON, a `tokenizers` tokenizer) and pick the EOS token."""
    if not path.exists():
        raise PrepareError(
            f"--tokenizer {str(path)!r} not found: pass the path of the model's tokenizer.json"
        )
    if path.is_dir():
        inside = path / "tokenizer.json"
        hint = f"pass {str(inside)!r}" if inside.is_file() else "pass the tokenizer.json file, not its folder"
        raise PrepareError(f"--tokenizer {str(path)!r} is a folder: {hint}")
    what = f"--tokenizer {str(path)!r}"
    fix = "pass a Hugging Face tokenizer.json (a fast tokenizer's save_pretrained writes one)"
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise PrepareError(f"cannot read {what}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PrepareError(
            f"{what} is not UTF-8 text (byte {exc.start}), so not a tokenizer.json: {fix}"
        ) from None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise PrepareError(f"{what} is not JSON ({exc.msg} at line {exc.lineno}): {fix}") from None
    try:
        tok = _tokenizers().Tokenizer.from_str(text)
    except Exception as exc:  # the Rust library raises a bare Exception
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise PrepareError(f"{what} is JSON but not a tokenizer.json ({reason}): {fix}") from None
    tok.no_truncation()
    tok.no_padding()
    fingerprint = fingerprint_json(tok.to_str())
    tok.encode_special_tokens = not parse_special
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
    eos = _pick_eos(tok, path, eos_token)
    return Encoder(
        tokenizer=tok,
        path=path,
        fingerprint=fingerprint,
        vocab_size=vocab_size,
        eos_token=eos,
        eos_id=int(tok.token_to_id(eos)),
    )


def _pick_eos(tok: Tokenizer, path: Path, eos_token: str | None) -> str:
    specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    listing = ", ".join(specials[:6]) + (", ..." if len(specials) > 6 else "") or "none"
    if eos_token is not None:
        if tok.token_to_id(eos_token) is None:
            raise PrepareError(
                f"--eos-token {eos_token!r} is not in the vocab of {str(path)!r}: "
                f"pick one of its tokens (special tokens: {listing})"
            )
        return eos_token
    config = path.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            named = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            raise PrepareError(
                f"{str(config)!r} (read for its eos_token) is not a JSON object: fix it, or pass --eos-token"
            ) from None
        if isinstance(named, dict):
            named = named.get("content")
        if isinstance(named, str) and named:
            if tok.token_to_id(named) is None:
                raise PrepareError(
                    f"{str(config)!r} names eos_token {named!r}, which is not in the vocab of "
                    f"{str(path)!r}: pass --eos-token (special tokens: {listing})"
                )
            return named
    for candidate in EOS_CANDIDATES:
        if tok.token_to_id(candidate) is not None:
            return candidate
    raise PrepareError(
        f"tokenizer {str(path)!r} has none of {', '.join(EOS_CANDIDATES)} and no tokenizer_config.json "
        f"eos_token beside it: pass --eos-token TOKEN (special tokens: {listing})"
    )


# --- the inputs ---------------------------------------------------------------------------------------


def classify(path: Path) -> Source:
    """The kind of one INPUT, from its suffix (a folder: a datasets save_to_disk folder)."""
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return Source(path, "datasets")
        raise PrepareError(
            f"input {str(path)!r} is a folder that datasets' save_to_disk did not write (no state.json or "
            f"dataset_dict.json): pass its files, or a save_to_disk folder"
        )
    suffix = path.suffix.lower()
    for kind, suffixes in (("text", TEXT_SUFFIXES), ("jsonl", JSONL_SUFFIXES), ("parquet", PARQUET_SUFFIXES)):
        if suffix in suffixes:
            return Source(path, kind)  # type: ignore[arg-type]
    seen = f"has an unknown extension {suffix!r}" if suffix else "has no extension"
    raise PrepareError(
        f"input {str(path)!r} {seen}: use .txt (text), .jsonl/.json (JSON lines), .parquet, "
        f"or a datasets save_to_disk folder"
    )


def _load_dataset(path: Path, split: str | None, text_field: str) -> Any:
    """The datasets.Dataset of a save_to_disk folder, its --text-field checked; offline, no progress bars."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # FileNotFoundError, or the arrow reader's errors on a damaged folder
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise PrepareError(
            f"input {str(path)!r} could not be loaded by datasets.load_from_disk ({reason}): "
            f"pass a folder that Dataset.save_to_disk wrote"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = ", ".join(ds) or "none"
        if split is None:
            raise PrepareError(f"input {str(path)!r} is a DatasetDict (splits: {splits}): pass --split")
        if split not in ds:
            raise PrepareError(f"input {str(path)!r} has no split {split!r} (splits: {splits}): fix --split")
        ds = ds[split]
    if text_field not in ds.column_names:
        raise PrepareError(
            f"input {str(path)!r} has no column {text_field!r} (columns: {', '.join(ds.column_names)}): "
            f"pass --text-field"
        )
    feature = ds.features[text_field]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise PrepareError(
            f"column {text_field!r} of input {str(path)!r} holds {feature}, not strings: pick a text column "
            f"with --text-field"
        )
    return ds.select_columns([text_field])


def _parquet_file(path: Path, text_field: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise PrepareError(
            f"input {str(path)!r} is not a Parquet file ({exc}): pass a .parquet file"
        ) from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise PrepareError(
            f"input {str(path)!r} has no column {text_field!r} (columns: {', '.join(schema.names)}): "
            f"pass --text-field"
        )
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise PrepareError(
            f"column {text_field!r} of input {str(path)!r} holds {kind}, not strings: pick a text column "
            f"with --text-field"
        )
    return pf


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{where} is not UTF-8 (byte {exc.start}): convert it to UTF-8") from None


def _text_docs(path: Path, split_lines: bool) -> Iterator[str]:
    text = _utf8(path.read_bytes(), f"input {str(path)!r}").removeprefix("\ufeff")
    if not split_lines:
        yield text
        return
    for line in text.split("\n"):
        if line.strip():
            yield line.removesuffix("\r")


def _jsonl_docs(path: Path, text_field: str) -> Iterator[str]:
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            where = f"input {str(path)!r} line {number}"
            line = _utf8(raw, where)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PrepareError(
                    f"{where} is not JSON ({exc.msg}): write one JSON object per line (JSON lines)"
                ) from None
            if not isinstance(obj, dict) or text_field not in obj:
                keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
                raise PrepareError(f"{where} has no field {text_field!r} (it has: {keys}): pass --text-field")
            value = obj[text_field]
            if not isinstance(value, str):
                raise PrepareError(
                    f"{where}: field {text_field!r} is {type(value).__name__}, not a string: "
                    f"fix the line or pick a text field with --text-field"
                )
            yield value


def _column_docs(batches: Iterator[list[Any]], path: Path, text_field: str) -> Iterator[str]:
    row = 0
    for values in batches:
        for value in values:
            row += 1
            if value is None:
                raise PrepareError(
                    f"input {str(path)!r} row {row}: {text_field!r} is null: drop or fill those rows"
                )
            yield value


def documents(source: Source, prepared: Any, *, text_field: str, split_lines: bool) -> Iterator[str]:
    """The documents of one input, in order; `prepared` is what `_open` returned for it."""
    if source.kind == "text":
        return _text_docs(source.path, split_lines)
    if source.kind == "jsonl":
        return _jsonl_docs(source.path, text_field)
    if source.kind == "parquet":
        batches = (b.column(0).to_pylist() for b in prepared.iter_batches(PARQUET_ROWS, columns=[text_field]))
        return _column_docs(batches, source.path, text_field)
    batches = (b[text_field] for b in prepared.iter(batch_size=PARQUET_ROWS))
    return _column_docs(batches, source.path, text_field)


def _open(source: Source, *, text_field: str, split: str | None) -> Any:
    """Check what can be checked before tokenizing (columns, splits), so most mistakes fail at once."""
    if source.kind == "parquet":
        return _parquet_file(source.path, text_field)
    if source.kind == "datasets":
        return _load_dataset(source.path, split, text_field)
    return None


# --- the output ---------------------------------------------------------------------------------------


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {str(out)!r} is a file, not a folder: pick a new or empty folder")
    if out.is_dir() and shard_files(out):
        raise PrepareError(f"--out {str(out)!r} already holds shards: pick a new or empty folder")


def _staging_folder(out: Path) -> Path:
    """A temporary folder beside --out (in its nearest existing ancestor), so the final moves are renames;
    the shards go in its subfolder `out`, made with the usual permissions (mkdtemp's are 0700)."""
    anchor = out.absolute().parent
    while not anchor.exists():
        anchor = anchor.parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.prepare-", dir=anchor))
    except OSError as exc:
        raise PrepareError(
            f"cannot create --out {str(out)!r}: {exc.strerror}; pick a folder you can write"
        ) from None
    (staging / "out").mkdir()
    return staging


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


class _ShardWriter:
    def __init__(self, folder: Path, *, shard_tokens: int, vocab_size: int, tokenizer_id: int) -> None:
        self.folder = folder
        self.shard_tokens = shard_tokens
        self.vocab_size = vocab_size
        self.tokenizer_id = tokenizer_id
        self.buf: list[np.ndarray] = []
        self.size = 0
        self.written: list[tuple[str, int]] = []

    def add(self, tokens: np.ndarray) -> None:
        while tokens.size:
            take = min(self.shard_tokens - self.size, tokens.size)
            self.buf.append(tokens[:take])
            self.size += take
            tokens = tokens[take:]
            if self.size == self.shard_tokens:
                self.flush()

    def flush(self) -> None:
        if not self.size:
            return
        name = f"shard_{len(self.written):05d}.bin"
        tokens = np.concatenate(self.buf)
        write_shard(self.folder / name, tokens, vocab_size=self.vocab_size, tokenizer_id=self.tokenizer_id)
        self.written.append((name, int(tokens.size)))
        self.buf, self.size = [], 0


def _batches(docs: Iterator[str], stats: InputStats) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for doc in docs:
        if not doc:
            stats.empty_skipped += 1
            continue
        batch.append(doc)
        chars += len(doc)
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def prepare(
    inputs: Sequence[Path],
    out: Path,
    *,
    tokenizer: Path,
    text_field: str = "text",
    split: str | None = None,
    split_lines: bool = False,
    eos_token: str | None = None,
    parse_special: bool = False,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
) -> dict[str, Any]:
    """Tokenize `inputs` into shards in `out`; returns what it wrote to out/prepare.json.

    Raises PrepareError (one line) on bad input, having written nothing."""
    if shard_tokens < 1:
        raise PrepareError(f"--shard-tokens {shard_tokens}: must be at least 1")
    check_out(out)
    missing = [str(p) for p in inputs if not p.exists()]
    if missing:
        raise PrepareError(f"input(s) not found: {', '.join(missing)}; check the paths")
    sources = [classify(p) for p in inputs]
    enc = load_tokenizer(tokenizer, eos_token=eos_token, parse_special=parse_special)
    opened = [_open(s, text_field=text_field, split=split) for s in sources]
    staging = _staging_folder(out)
    stats: list[InputStats] = []
    try:
        writer = _ShardWriter(
            staging / "out",
            shard_tokens=shard_tokens,
            vocab_size=enc.vocab_size,
            tokenizer_id=enc.fingerprint,
        )
        for source, prepared in zip(sources, opened, strict=True):
            seen = InputStats(path=str(source.path.absolute()), kind=source.kind)
            try:
                docs = documents(source, prepared, text_field=text_field, split_lines=split_lines)
                for batch in _batches(docs, seen):
                    tokens = enc.encode(batch)
                    seen.documents += len(batch)
                    seen.tokens += int(tokens.size)
                    writer.add(tokens)
            except OSError as exc:
                raise PrepareError(f"cannot read input {str(source.path)!r}: {exc.strerror}") from None
            stats.append(seen)
        writer.flush()
        if not writer.written:
            raise PrepareError(
                f"the inputs hold no text (0 documents in {len(inputs)} input(s)): "
                f"check the files and --text-field"
            )
        settings = dict(
            text_field=text_field, split=split, split_lines=split_lines, parse_special=parse_special
        )
        summary = _summary(enc, writer, stats, settings)
        _write_json(staging / "out" / "prepare.json", summary)
        _move_in(staging / "out", out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def _summary(
    enc: Encoder, writer: _ShardWriter, stats: list[InputStats], settings: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tool": "python -m fsdpkit.data.prepare_data",
        "tokenizer": str(enc.path.absolute()),
        "fingerprint": f"{enc.fingerprint:016x}",
        "tokenizers_version": _tokenizers().__version__,
        "vocab_size": enc.vocab_size,
        "itemsize": 2 if enc.vocab_size <= 2**16 else 4,
        "eos_token": enc.eos_token,
        "eos_id": enc.eos_id,
        **settings,
        "documents": sum(s.documents for s in stats),
        "empty_documents_skipped": sum(s.empty_skipped for s in stats),
        "tokens": sum(s.tokens for s in stats),
        "shards": [{"name": name, "tokens": n} for name, n in writer.written],
        "inputs": [vars(s) for s in stats],
    }


def _move_in(staging: Path, out: Path) -> None:
    """Staging becomes --out (one rename when --out is new), or its files move into the existing --out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        shutil.move(staging, out)
        return
    for f in sorted(staging.iterdir(), key=lambda p: p.name == "prepare.json"):  # prepare.json last
        shutil.move(f, out / f.name)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog=program("python -m fsdpkit.data.prepare_data"), description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT",
        help=".txt, .jsonl/.json (JSON lines), .parquet files or datasets save_to_disk folders",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", required=True, type=Path, metavar="PATH", help="the model's tokenizer.json"
    )
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="output folder for shard_*.bin (new or empty)"
    )
    parser.add_argument(
        "--text-field",
        default="text",
        metavar="FIELD",
        help="JSON field or column of the text (default text)",
    )
    parser.add_argument("--split", metavar="SPLIT", help="the split of DatasetDict folders (e.g. train)")
    parser.add_argument(
        "--split-lines",
        action="store_true",
        help=".txt inputs: one document per non-blank line, not per file",
    )
    parser.add_argument(
        "--eos-token", metavar="TOKEN", help="token appended after each document (default: the tokenizer's)"
    )
    parser.add_argument(
        "--parse-special",
        action="store_true",
        help="special tokens written in the text become special tokens",
    )
    parser.add_argument(
        "--shard-tokens",
        type=int_arg(lo=1),
        default=DEFAULT_SHARD_TOKENS,
        metavar="N",
        help="max tokens per shard (1e8)",
    )
    args = parser.parse_args(argv)
    try:
        summary = prepare(
            args.inputs,
            args.out,
            tokenizer=args.tokenizer,
            text_field=args.text_field,
            split=args.split,
            split_lines=args.split_lines,
            eos_token=args.eos_token,
            parse_special=args.parse_special,
            shard_tokens=args.shard_tokens,
        )
    except (PrepareError, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    print(
        f"wrote {len(summary['shards'])} shard(s) to {args.out}: {summary['documents']:,} documents, "
        f"{summary['tokens']:,} tokens (vocab {summary['vocab_size']}, eos {summary['eos_token']!r} = "
        f"{summary['eos_id']}, tokenizer fingerprint {summary['fingerprint']})"
    )
    return exitcodes.OK


def entry() -> None:
    """The `kit-prepare-data` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
