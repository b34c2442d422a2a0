"""kit-export-hf: a run's committed checkpoint as a Hugging Face model folder.

    kit-export-hf RUN_DIR OUT [--step N] [--config MODEL_DIR | --model NAME] [--tokenizer DIR]
                  [--dtype float32|bfloat16|float16] [--max-shard-size 5GB] [--force] [--no-checksum]

RUN_DIR is `<run.root>/<run.id>` (or its checkpoints/ folder, or one step_<N> folder); OUT a new or empty
folder. A model trained from a Hugging Face folder needs `--config`, that folder; the kit's own Llama
needs nothing (`--model` names its shape when the checkpoint's tensors fit several). Refusals are one line
on stderr: exit 78 (fsdpkit.contracts.exitcodes.FATAL_CONFIG), 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.cliargs import OneLineParser, int_arg, parse_float, program
from fsdpkit.contracts.shapes import MODEL_CONFIGS

_SIZE = re.compile(r"^\s*([0-9.eE+-]+)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                 "float16": "float16", "fp16": "float16"}  # fmt: skip


def size_arg(text: str) -> int:
    """A byte count: a whole number, or a number with a unit as `save_pretrained` takes them (5GB = 5e9,
    2GiB = 2 x 2^30, 500MB)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 5GB, 500MB, 2GiB or a number of bytes")
    try:
        number = parse_float(match.group(1), "size", lo=0, lo_open=True)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be a finite number above 0") from None
    value = int(number * _UNITS[(match.group(2) or "b").lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: under one byte")
    return value


def dtype_arg(text: str) -> str:
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"{text!r}: one of float32, bfloat16, float16")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=program("python -m fsdpkit.export"), description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="the run folder (<run.root>/<run.id>)")
    p.add_argument("out", type=Path, metavar="OUT", help="the model folder to write (new or empty)")
    p.add_argument(
        "--step",
        type=int_arg(lo=0),
        metavar="N",
        help="export step N (default: the newest committed step that verifies)",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        type=Path,
        metavar="MODEL_DIR",
        help="the Hugging Face model folder the run trained from (its config.json)",
    )
    source.add_argument(
        "--model",
        choices=list(MODEL_CONFIGS),
        metavar="NAME",
        help=f"the kit's own Llama: its shape, {', '.join(MODEL_CONFIGS)} (default: the one that fits)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="copy this folder's tokenizer files (default: --config's, if it has them)",
    )
    p.add_argument(
        "--dtype",
        type=dtype_arg,
        default="float32",
        help="float32 (default), bfloat16 or float16 for the floating tensors",
    )
    p.add_argument(
        "--max-shard-size",
        type=size_arg,
        default="5GB",
        metavar="SIZE",
        help="largest safetensors file before splitting (default 5GB, as save_pretrained)",
    )
    p.add_argument(
        "--force", action="store_true", help="OUT may hold files: its old weights go, its other files stay"
    )
    p.add_argument(
        "--no-checksum",
        action="store_true",
        help="verify file sizes only, not checksums (faster; a flipped byte goes unseen)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fsdpkit.export.errors import ExportError
    from fsdpkit.export.export import ExportRequest, export_hf  # torch: after the command line is good

    request = ExportRequest(
        run=args.run,
        out=args.out,
        step=args.step,
        config=args.config,
        model=args.model,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        max_shard_bytes=args.max_shard_size,
        force=args.force,
        checksum=not args.no_checksum,
    )
    try:
        summary = export_hf(
            request,
            warn=lambda line: print(f"warning: {line}", file=sys.stderr),
            progress=lambda line: print(line, flush=True),
        )
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    except KeyboardInterrupt:
        print(f"interrupted: {args.out} left as it was", file=sys.stderr)
        return 128 + 2
    print(summary.line())
    return exitcodes.OK


def entry() -> None:
    """The `kit-export-hf` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
