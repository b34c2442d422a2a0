"""Make token shards from text files: `python -m fsdpkit.data.make_shards TEXT_FILES... --out DIR`.

Tokenizer: byte-level, documented and dependency-free. Each file is one document; its UTF-8 bytes are
the token ids 0-255 and token 256 (EOS) ends the document, so the vocab size is 257 (uint16 shards).
Shards hold at most --shard-tokens tokens each and are named shard_00000.bin, ... (format:
fsdpkit.resilience.dataset.format).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.cliargs import OneLineParser, int_arg, program
from fsdpkit.resilience.dataset.format import shard_files, write_shard

EOS = 256
VOCAB_SIZE = 257


def encode(text: bytes) -> np.ndarray:
    """Byte-level tokens of one document, EOS-terminated."""
    return np.concatenate(
        [np.frombuffer(text, dtype=np.uint8).astype(np.uint16), np.array([EOS], dtype=np.uint16)]
    )


def decode(tokens: np.ndarray) -> list[bytes]:
    """Inverse of `encode` over a stream: the documents (bytes) in order."""
    tokens = np.asarray(tokens)
    cuts = np.flatnonzero(tokens == EOS)
    docs, start = [], 0
    for cut in cuts:
        docs.append(tokens[start:cut].astype(np.uint8).tobytes())
        start = cut + 1
    return docs


def _chunks(files: list[Path], shard_tokens: int) -> Iterator[np.ndarray]:
    buf: list[np.ndarray] = []
    size = 0
    for f in files:
        toks = encode(f.read_bytes())
        while toks.size:
            take = min(shard_tokens - size, toks.size)
            buf.append(toks[:take])
            size += take
            toks = toks[take:]
            if size == shard_tokens:
                yield np.concatenate(buf)
                buf, size = [], 0
    if size:
        yield np.concatenate(buf)


def make_shards(files: list[Path], out: Path, *, shard_tokens: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, tokens in enumerate(_chunks(files, shard_tokens)):
        path = out / f"shard_{i:05d}.bin"
        write_shard(path, tokens, vocab_size=VOCAB_SIZE)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog=program("python -m fsdpkit.data.make_shards"), description=__doc__.splitlines()[0]
    )
    parser.add_argument("files", nargs="+", type=Path, help="UTF-8 (or any) text files; one document each")
    parser.add_argument("--out", required=True, type=Path, help="output folder for shard_*.bin")
    parser.add_argument(
        "--shard-tokens", type=int_arg(lo=1), default=100_000_000, help="max tokens per shard (default 1e8)"
    )
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"error: input file(s) not found: {', '.join(missing)}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    if args.out.exists() and not args.out.is_dir():
        print(
            f"error: --out {str(args.out)!r} is a file, not a folder: pick a new or empty folder",
            file=sys.stderr,
        )
        return exitcodes.FATAL_CONFIG
    if args.out.is_dir() and shard_files(args.out):
        print(f"error: {args.out} already holds shards: pick an empty --out folder", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"error: cannot create --out {str(args.out)!r}: {exc.strerror}; pick a folder you can write",
            file=sys.stderr,
        )
        return exitcodes.FATAL_CONFIG
    written = make_shards(args.files, args.out, shard_tokens=args.shard_tokens)
    print(f"wrote {len(written)} shard(s) to {args.out} (vocab {VOCAB_SIZE}, byte-level tokenizer)")
    return exitcodes.OK


def entry() -> None:
    """The `kit-make-shards` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
