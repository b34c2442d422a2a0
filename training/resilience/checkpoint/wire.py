"""The kit's own format for a tree of plain values: tagged JSON, never a pickle.

Used for what crosses a trust boundary without DCP: the memory tier's blob header (`blob`) and every message
the checkpoint's collectives exchange between ranks (`comm`: verdicts, file lists, commit and tier records).
Both used to be pickles, and unpickling runs whatever the bytes ask for: a planted blob or a rank that is
not the kit's could run code on every rank. JSON builds only JSON values; the few types the kit needs beyond
them are tagged objects decoded by this module alone, each rebuilt from plain values:

- JSON itself: None, bool, int, float (NaN and infinities as Python's json writes them), str; a list is
  `{"l": [...]}`, so a dict is never mistaken for a tag;
- `{"t": [...]}` tuple, `{"s": [...]}` set, `{"d": [[key, value], ...]}` dict (any encodable key: optimizer
  state is keyed by ints), `{"S": [...]}` torch.Size, `{"dt": "float32"}` dtype;
- `{"r": name, "f": {...}}` one of the kit's own records (`RECORDS`: frozen dataclasses of plain fields),
  rebuilt by its constructor, which checks its fields;
- `{"x": [dtype, shape, offset, nbytes]}` a tensor's place in a blob (`TensorRef`), only where the caller
  allows tensors.

Anything else is refused when written (TypeError: the caller's data is not the kit's) and when read
(`WireError`, one line saying what was refused).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pickletools
from dataclasses import dataclass
from typing import Any

import torch

from fsdpkit.resilience.checkpoint.commit import CommitRecord, FileEntry
from fsdpkit.resilience.checkpoint.tier import TierRecord

RECORDS: dict[str, type] = {cls.__name__: cls for cls in (CommitRecord, FileEntry, TierRecord)}
"""The kit's records that may cross as themselves; each is rebuilt through its own constructor."""
_MAX_DEPTH = 64


class WireError(ValueError):
    """Bytes that are not a tree of the kit's plain values; one line."""


@dataclass(frozen=True)
class TensorRef:
    """A tensor's place in a blob: dtype name, local shape, offset in the data section, bytes."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _encode(obj: Any, path: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError(f"{path or '/'}: nested deeper than {_MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, TensorRef):
        return {"x": [obj.dtype, list(obj.shape), obj.offset, obj.nbytes]}
    if isinstance(obj, torch.dtype):
        return {"dt": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.Size):
        return {"S": list(obj)}
    if isinstance(obj, dict):
        return {
            "d": [[_encode(k, path, depth + 1), _encode(v, f"{path}/{k}", depth + 1)] for k, v in obj.items()]
        }
    if isinstance(obj, (list, tuple, set, frozenset)):
        tag = "l" if isinstance(obj, list) else "t" if isinstance(obj, tuple) else "s"
        items = sorted(obj, key=repr) if tag == "s" else obj
        return {tag: [_encode(v, f"{path}/{i}", depth + 1) for i, v in enumerate(items)]}
    if type(obj).__name__ in RECORDS and RECORDS[type(obj).__name__] is type(obj):
        fields = {
            f.name: _encode(getattr(obj, f.name), f"{path}/{f.name}", depth + 1)
            for f in dataclasses.fields(obj)
        }
        return {"r": type(obj).__name__, "f": fields}
    raise TypeError(f"{path or '/'}: a {type(obj).__qualname__}; the kit sends and keeps only plain values")


def encode(obj: Any) -> bytes:
    """`obj` as UTF-8 JSON; TypeError naming the first value that is not one of the kit's plain types."""
    return json.dumps(_encode(obj, "", 0), separators=(",", ":"), allow_nan=True).encode()


def _dtype(name: Any) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise WireError(f"refused dtype {str(name)[:40]!r}")
    return value


def _ints(values: Any, what: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int and v >= 0 for v in values):
        raise WireError(f"{what} is not a list of non-negative integers")
    return values


def _record(name: Any, fields: Any, depth: int) -> Any:
    cls = RECORDS.get(name) if isinstance(name, str) else None
    if cls is None or not isinstance(fields, dict):
        raise WireError(f"refused record type {str(name)[:60]!r}")
    try:
        return cls(**{str(k): _decode(v, depth + 1) for k, v in fields.items()})
    except (TypeError, ValueError) as exc:
        raise WireError(f"a {name} with bad fields ({exc})") from None


def _tagged(tag: str, body: Any, depth: int) -> Any:
    if tag in ("l", "t", "s", "d") and not isinstance(body, list):
        raise WireError(f"a {tag!r} entry without a list")
    if tag == "l":
        return [_decode(v, depth + 1) for v in body]
    if tag == "t":
        return tuple(_decode(v, depth + 1) for v in body)
    if tag == "s":
        return {_decode(v, depth + 1) for v in body}
    if tag == "d":
        if not all(isinstance(p, list) and len(p) == 2 for p in body):
            raise WireError("a dict entry that is not a list of pairs")
        return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in body}
    if tag == "S":
        return torch.Size(_ints(body, "a torch.Size"))
    if tag == "dt":
        return _dtype(body)
    if tag == "x":
        if not isinstance(body, list) or len(body) != 4:
            raise WireError("a tensor entry that is not [dtype, shape, offset, nbytes]")
        dtype, shape, offset, nbytes = body
        _dtype(dtype)
        _ints([offset, nbytes], "a tensor's offset and size")
        return TensorRef(dtype, tuple(_ints(shape, "a tensor's shape")), offset, nbytes)
    raise WireError(f"refused entry {tag[:20]!r}")


def _decode(obj: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise WireError(f"nested deeper than {_MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        if set(obj) == {"r", "f"}:
            return _record(obj["r"], obj["f"], depth)
        if len(obj) == 1:
            ((tag, body),) = obj.items()
            return _tagged(tag, body, depth)
    raise WireError(f"refused entry of JSON type {type(obj).__name__}")


def decode(data: bytes | memoryview, *, tensors: bool = False) -> Any:
    """The tree `encode` wrote; WireError (one line) for anything else: no JSON, an unknown tag, a record
    type outside `RECORDS`, a tensor entry where `tensors` is False."""
    raw = bytes(data)
    if raw[:1] == b"\x80":  # pickle protocol 2+: never loaded, only named
        named = ", ".join(pickle_globals(raw)[:3]) or "no global"
        raise WireError(f"refused a pickle ({named}): the kit reads JSON only")
    try:
        tree = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"not the kit's JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    try:
        value = _decode(tree, 0)
    except RecursionError:
        raise WireError("nested too deep") from None
    if not tensors and _has_ref(value, 0):
        raise WireError("refused a tensor entry outside a blob")
    return value


def _has_ref(obj: Any, depth: int) -> bool:
    if isinstance(obj, TensorRef):
        return True
    if isinstance(obj, dict):
        return any(_has_ref(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_ref(v, depth + 1) for v in obj)
    return False


def pickle_globals(data: bytes) -> list[str]:
    """The globals a pickle would import, read from its opcodes without running any (to name them in a
    refusal; what was read before an error when `data` is no pickle or a truncated one)."""
    found: list[str] = []
    strings: list[str] = []
    with contextlib.suppress(Exception):  # not a pickle: what was read so far
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
    return found
