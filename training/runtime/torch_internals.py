"""Every private torch name the kit uses, in one place, checked before it is relied on.

torch has no public way to do a few things the kit needs (list below: the rendezvous' poll, keep-alive and
join rules, an agent's restart budget and worker processes, a zip archive without its CRC pass, aborting
every process group at once). Those names are private: a torch release may rename or drop one, and the
usual failure is silent (an assignment to a name that no longer exists just creates an unused attribute;
a `getattr(..., None)` finds nothing; an override of a renamed hook is never called), so recovery gets
slower or wrong and nothing says so. Here:

- every private name the kit reads, replaces or overrides is an `Internal` in `INTERNALS`, with why;
- the rest of the kit reaches them only through this module (the aliases and functions below), and
  replaces a torch function only with `replace`, which refuses a name that is gone;
- each override of a torch hook is marked `@override`, and its class is checked with `override_problems`
  (the runtime's own, `OWN_OVERRIDES`, always; the launcher passes its agent and executor as `overrides`);
- `check()` runs at start-up (the launcher, and every worker before its process group): the torch version
  is not older than the tested range, every name exists with the parameters the kit calls it with, the
  kit's overrides of torch's hooks still override something, and the zip shortcut round-trips a tensor. A
  problem is one line naming the torch version and the name; the caller exits FATAL_CONFIG (78). A torch
  newer than the tested range whose every check passes runs, with one warning line per node.

Instance attributes that exist only once torch built the object (a handler's state holder) are checked
where the kit makes the object (`require`), still before anything trains.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import os
import pickle
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fsdpkit.contracts import env
from fsdpkit.runtime.error_file import AtomicErrorHandler

SUPPORTED = ((2, 11), (2, 15))
"""Oldest and newest torch minor releases the kit is tested on (the accelerator machines' 2.11, the CPU pin
and the image's 2.13, `make test-torch` up to 2.15). An older one is refused: the kit handles release
differences only from 2.11 on. A newer one runs, with a warning, when every private name checks out (a rename
is what breaks the kit)."""
SUPPORTED_TEXT = "2.11 to 2.15"
UNTESTED_WARNED_ENV = env.TORCH_UNTESTED_WARNED
OWN_OVERRIDES: tuple[type, ...] = (AtomicErrorHandler,)
"""The runtime's overrides of torch's hooks, checked with every caller's `overrides` (the trainer's error
file: `ErrorHandler._get_error_file_path` below)."""


class TorchInternalsChanged(RuntimeError):
    """A private torch name the kit needs is gone or changed (one line: the torch version and the name)."""


@dataclass(frozen=True, kw_only=True)
class Internal:
    module: str
    name: str
    """Dotted path inside the module ('Class.attr' for a class attribute)."""
    params: tuple[str, ...] | None = None
    """Leading parameter names the kit passes (None: not called, or called without arguments)."""
    fields: tuple[str, ...] = ()
    """Attributes an instance or an enum must have (read from the class: annotations, members, slots)."""
    why: str = ""
    c10d_rendezvous: bool = False
    """Used only by torch's c10d rendezvous with the kit's spares (--rdzv-backend=c10d): a launcher on the
    kit's own rendezvous (the default) does not need it, and is not refused when torch changed it."""


DR = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
METADATA_PRIVATES = (
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
)
"""Private names a DCP `.metadata` pickle imports besides DCP's public metadata classes (torch 2.13): the
memory-format code of TensorProperties, an item's storage record, the function a layout is pickled as."""


def _c10d(name: str, **fields: Any) -> Internal:
    """A name of torch's c10d dynamic rendezvous, needed only with --rdzv-backend=c10d."""
    return Internal(c10d_rendezvous=True, module=DR, name=name, **fields)


INTERNALS: tuple[Internal, ...] = (
    # --- torch's c10d rendezvous with the kit's spares (launcher/rendezvous/c10d.py, --rdzv-backend=c10d) ---
    _c10d(
        "_RendezvousJoinOp.__call__",
        params=("self", "ctx", "deadline"),
        why="spare join rules",
    ),
    _c10d(
        "_DistributedRendezvousOpExecutor",
        params=("self", "node", "state_holder", "settings"),
        fields=("_node", "_state"),
        why="stable ranks across rounds",
    ),
    _c10d(
        "DynamicRendezvousHandler",
        fields=("_this_node", "_state_holder", "_settings", "_op_executor"),
        why="the kit's executor and state cache",
    ),
    _c10d(
        "_Action",
        fields=("KEEP_ALIVE", "SYNC", "REMOVE_FROM_WAIT_LIST"),
    ),
    _c10d(
        "_RendezvousContext",
        params=("self", "node", "state", "settings"),
    ),
    _c10d(
        "_RendezvousState",
        fields=(
            *("round", "complete", "closed"),
            *("participants", "wait_list", "redundancy_list", "last_heartbeats"),
        ),
        why="the membership the join rules read",
    ),
    _c10d("_delay", params=("seconds",), why="the 1 s state poll"),
    _c10d(
        "_should_keep_alive",
        params=("ctx",),
        why="keep-alive due at half an interval",
    ),
    _c10d(
        "get_method_name",
        params=("depth",),
        why="inspect.stack() per rendezvous step",
    ),
    _c10d(
        "_BackendRendezvousStateHolder",
        fields=("_cache_duration",),
        why="state cache",
    ),
    _c10d("_BackendRendezvousStateHolder.sync", params=("self",)),
    Internal(
        c10d_rendezvous=True,
        module="torch.distributed.elastic.rendezvous.api",
        name="get_free_port",
        why="MASTER_PORT with the NVRx store ports free",
    ),
    Internal(module="torch.distributed.launcher.api", name="_get_addr_and_port", params=("rdzv_parameters",)),
    # --- the error file (training/runtime/error_file.py) ----------------------------------------------------
    Internal(
        module="torch.distributed.elastic.multiprocessing.errors.error_handler",
        name="ErrorHandler._get_error_file_path",
        params=("self",),
        why="AtomicErrorHandler overrides it: a rank's error file is written beside, then renamed",
    ),
    # --- the agent (training/launcher/agent.py) -------------------------------------------------------------
    Internal(
        module="torch.distributed.elastic.agent.server.local_elastic_agent",
        name="LocalElasticAgent",
        fields=("_pcontext", "_remaining_restarts"),
        why="the workers' pids and error files; the restart budget",
    ),
    # --- checkpoints (training/resilience/checkpoint/) ------------------------------------------------------
    Internal(
        module="torch.serialization",
        name="_save",
        params=("obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"),
        why="an archive without the zip's CRC pass",
    ),
    Internal(module="torch.serialization", name="_get_storage_alignment", params=()),
    Internal(module="torch._C", name="PyTorchFileWriter"),
    Internal(
        module="torch.distributed.checkpoint.filesystem",
        name="_StorageInfo",
        fields=("relative_path", "offset", "length"),
        why="DCP's storage record of an item",
    ),
    Internal(module="torch.distributed.checkpoint.filesystem", name="_StoragePrefix", fields=("prefix",)),
    # --- untrusted checkpoint bytes (training/resilience/checkpoint/untrusted.py) ---------------------------
    Internal(
        module="torch.distributed.checkpoint.filesystem",
        name="FileSystemReader.read_metadata",
        params=("self",),
        why="SafeReader overrides it: `.metadata` through the allowlisted unpickler, not pickle.load",
    ),
    Internal(
        module="torch.distributed.checkpoint.default_planner",
        name="DefaultLoadPlanner.load_bytes",
        params=("self", "read_item", "value"),
        why="SafeLoadPlanner overrides it: byte items through weights_only=True, not weights_only=False",
    ),
    Internal(
        module="torch.distributed.checkpoint.default_planner",
        name="DefaultLoadPlanner",
        fields=("flatten_state_dict", "original_state_dict", "mappings", "state_dict", "metadata"),
        why="where load_bytes puts a loaded value",
    ),
    Internal(
        module="torch.distributed.checkpoint._traverse",
        name="set_element",
        params=("root_dict", "path", "value"),
        why="a loaded byte item into the nested state, as DCP's own load_bytes does",
    ),
    *(
        Internal(module=module, name=name, why="a class `.metadata` pickles: on the unpickler's allowlist")
        for module, name in METADATA_PRIVATES
    ),
    Internal(
        module="torch.distributed.tensor",
        name="DTensor",
        fields=("_local_tensor",),
        why="a shard's bytes without an autograd call per item",
    ),
    Internal(module="torch.distributed.tensor", name="DTensor._raise_if_contains_partial_placements"),
    # --- in-process restart (training/runtime/distributed.py)
    # -------------------------------------------------------
    Internal(module="torch.distributed.distributed_c10d", name="_abort_process_group", params=("group",)),
    Internal(
        module="torch.distributed.device_mesh",
        name="DeviceMesh",
        fields=("_pg_registry",),
        why="an aborted group's sockets stay open while a mesh holds it",
    ),
    Internal(
        module="torch.distributed.tensor",
        name="DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear",
        why="DTensor's sharding cache keeps old meshes alive",
    ),
)


# --- the checks ---------------------------------------------------------------------------------------------


def _minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]))


def version_problem(version: str) -> str | None:
    """Why this torch version is refused (unreadable, or older than the tested range), or None."""
    minor = _minor(version)
    if minor is None:
        return f"torch {version}: cannot read its version; the kit supports torch {SUPPORTED_TEXT}"
    if minor < SUPPORTED[0]:
        return (
            f"torch {version} is not supported: it is older than the kit's tested range ({SUPPORTED_TEXT}), "
            f"and the kit handles release differences only from {SUPPORTED[0][0]}.{SUPPORTED[0][1]} on; "
            "install torch==2.13.0 (requirements/dev.txt, the kit's image) or 2.11 to 2.15"
        )
    return None


def untested_warning(version: str) -> str | None:
    """The warning for a torch newer than the tested range (its private names checked out), or None."""
    minor = _minor(version)
    if minor is None or minor <= SUPPORTED[1]:
        return None
    return (
        f"warning: torch {version} is newer than the kit's tested range ({SUPPORTED_TEXT}); every private "
        "torch name the kit relies on checked out, so it runs (training/runtime/torch_internals.py)"
    )


def _resolve(module: str, name: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _has_field(obj: Any, field: str) -> bool:
    """A class (or enum) field: a member, a class attribute, an annotation or a slot of it or its bases."""
    if hasattr(obj, field):
        return True
    for klass in getattr(obj, "__mro__", ()):
        if field in getattr(klass, "__annotations__", {}) or field in getattr(klass, "__slots__", ()):
            return True
        if any(field in _names(f) for f in vars(klass).values()):
            return True
    return False


def _names(function: Any) -> tuple[str, ...]:
    """The attribute and global names a Python function's bytecode uses (`self.<field>` among them)."""
    code = getattr(function, "__code__", None)
    return () if code is None else code.co_names


def _params(obj: Any) -> list[str] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def internal_problem(item: Internal) -> str | None:
    """Why one private name is not what the kit expects, or None."""
    where = f"{item.module}.{item.name}"
    try:
        obj = _resolve(item.module, item.name)
    except (ImportError, AttributeError):
        return f"{where} is gone"
    if item.params is not None:
        params = _params(obj)
        if params is not None and params[: len(item.params)] != list(item.params):
            return f"{where} takes ({', '.join(params)}), the kit calls it with ({', '.join(item.params)})"
    for field in item.fields:
        if not _has_field(obj, field):
            return f"{where} has no {field}"
    return None


def override_problems(klass: type) -> list[str]:
    """The kit's overrides of torch's hooks (methods of `klass` marked `@override`) that no longer override
    anything in its bases, or whose parameters differ: torch would never call them, or call them wrongly."""
    found = []
    for name, method in vars(klass).items():
        if not getattr(method, "__override__", False):
            continue
        base = next((b.__dict__[name] for b in klass.__mro__[1:] if name in b.__dict__), None)
        if base is None:
            found.append(f"{klass.__qualname__}.{name} overrides nothing in {klass.__mro__[1].__module__}")
            continue
        ours, theirs = _params(method), _params(base)
        if ours is not None and theirs is not None and not _compatible(method, ours, theirs):
            found.append(
                f"{base.__module__}.{base.__qualname__} takes ({', '.join(theirs)}), the kit's override "
                f"({', '.join(ours)})"
            )
    return found


def _compatible(method: Callable[..., Any], ours: list[str], theirs: list[str]) -> bool:
    """Torch's parameters come first, in order, and any the kit adds have defaults (an override written for
    the newest torch that an older one calls with fewer arguments)."""
    if ours[: len(theirs)] != theirs:
        return False
    extra = list(inspect.signature(method).parameters.values())[len(theirs) :]
    return all(p.default is not inspect.Parameter.empty for p in extra)


def _zip_round_trip_problem() -> str | None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = io.BytesIO()
    serialize_tensor(out, tensor, storage_alignment())
    out.seek(0)
    try:
        back = torch.load(out, weights_only=True)
    except Exception as exc:  # any failure to read it back is the finding
        why = " ".join(str(exc).split())
        return f"torch.serialization._save: an archive written without torch.save does not load ({why})"
    if not torch.equal(back, tensor):
        return "torch.serialization._save: an archive written without torch.save loads other values"
    return None


def problems(overrides: tuple[type, ...] = (), *, c10d_rendezvous: bool = True) -> list[str]:
    """Every problem with this torch's private names: each name, each override, the zip shortcut (the c10d
    rendezvous' names only with `c10d_rendezvous`)."""
    wanted = [item for item in INTERNALS if c10d_rendezvous or not item.c10d_rendezvous]
    found = [p for item in wanted if (p := internal_problem(item)) is not None]
    for klass in (*OWN_OVERRIDES, *overrides):
        found += override_problems(klass)
    if not found and (problem := _zip_round_trip_problem()) is not None:
        found.append(problem)
    return [f"torch {torch.__version__}: {p}" for p in found]


def describe(found: list[str]) -> str:
    """One line: the first problem, how many more, what to do."""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"{found[0]}{more}: the kit relies on it (training/runtime/torch_internals.py); "
        f"use a supported torch ({SUPPORTED_TEXT})"
    )


@functools.cache
def check(overrides: tuple[type, ...] = (), *, c10d_rendezvous: bool = False) -> str | None:
    """One line if this torch cannot run the kit, else None (checked once per process and set of classes).
    A torch newer than the tested range that passes every check gets one warning line on stderr."""
    if (problem := version_problem(torch.__version__)) is not None:
        return problem
    found = problems(overrides=overrides, c10d_rendezvous=c10d_rendezvous)
    if found:
        return describe(found)
    if (warning := untested_warning(torch.__version__)) is not None:
        _warn_once(warning)
    return None


def _warn_once(line: str) -> None:
    """Print `line` unless this node already did: a worker of a launcher that warned, or a local rank
    other than 0 (torchrun's workers, whose launcher checks nothing)."""
    if os.environ.get(UNTESTED_WARNED_ENV) == torch.__version__ or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    os.environ[UNTESTED_WARNED_ENV] = torch.__version__
    print(line, file=sys.stderr, flush=True)


def require(obj: Any, *names: str) -> None:
    """Raise TorchInternalsChanged unless `obj` (made by torch) has each private attribute."""
    for name in names:
        if not hasattr(obj, name):
            where = f"{type(obj).__module__}.{type(obj).__qualname__}.{name}"
            raise TorchInternalsChanged(describe([f"torch {torch.__version__}: {where} is gone"]))


def replace(module: Any, name: str, value: Any) -> Any:
    """Set `module.name` to `value` and return what was there; refuses a name torch no longer has (the
    assignment would only add an attribute nothing reads)."""
    if not hasattr(module, name):
        raise TorchInternalsChanged(
            describe([f"torch {torch.__version__}: {module.__name__}.{name} is gone"])
        )
    old = getattr(module, name)
    setattr(module, name, value)
    return old


# --- the accessors the kit uses -----------------------------------------------------------------------------
# Read with a stand-in when gone, so that importing the kit still works and `check()` says what is missing.


class _Gone:
    """Stands in for a private torch class that is gone (subclassing it still works; `check()` reports it)."""


def _private(module: str, name: str, default: Any = _Gone) -> Any:
    try:
        return _resolve(module, name)
    except (ImportError, AttributeError):
        return default


dynamic_rendezvous = importlib.import_module(DR)
StorageInfo = _private("torch.distributed.checkpoint.filesystem", "_StorageInfo")
StoragePrefix = _private("torch.distributed.checkpoint.filesystem", "_StoragePrefix")
addr_and_port = _private("torch.distributed.launcher.api", "_get_addr_and_port", None)
RendezvousJoinOp = _private(DR, "_RendezvousJoinOp")
RendezvousOpExecutor = _private(DR, "_DistributedRendezvousOpExecutor")
RendezvousAction = _private(DR, "_Action")
RendezvousContext = _private(DR, "_RendezvousContext")
rendezvous_delay = _private(DR, "_delay", None)
rendezvous_method_name = _private(DR, "get_method_name", None)
set_element = _private("torch.distributed.checkpoint._traverse", "set_element", None)
"""`set_element(root_dict, path, value)`: DCP's own way to put a value at a nested path."""


def metadata_privates() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for each of METADATA_PRIVATES this torch has (`check()` names one gone)."""
    found = {(module, name): _private(module, name) for module, name in METADATA_PRIVATES}
    return {key: obj for key, obj in found.items() if obj is not _Gone}


def state_holder(handler: Any) -> Any:
    """A DynamicRendezvousHandler's state holder (its `sync()` and `state`)."""
    require(handler, "_state_holder")
    return handler._state_holder


def use_op_executor(handler: Any, make: Callable[[Any, Any, Any], Any]) -> None:
    """Run a DynamicRendezvousHandler's steps with `make(node, state_holder, settings)`'s executor."""
    require(handler, "_op_executor", "_this_node", "_state_holder", "_settings")
    handler._op_executor = make(handler._this_node, handler._state_holder, handler._settings)


def executor_state(executor: Any) -> Any:
    """The rendezvous state an op executor is changing (torch's `_RendezvousState`)."""
    return executor._state


def executor_node(executor: Any) -> Any:
    return executor._node


def set_state_cache(holder: Any, seconds: float) -> None:
    """How long a state holder reuses the state it read (torch: 1 s)."""
    require(holder, "_cache_duration")
    holder._cache_duration = seconds


def remaining_restarts(agent: Any) -> int:
    return agent._remaining_restarts


def spend_restarts(agent: Any) -> None:
    """Leave the agent no restart (its inherited loop then stops instead of retrying)."""
    require(agent, "_remaining_restarts")
    agent._remaining_restarts = 0


def agent_options(agent_class: type, *, shutdown_timeout: int) -> dict[str, Any]:
    """LocalElasticAgent's keyword arguments this torch takes: `shutdown_timeout` is 2.13's (2.11 waits
    torch's fixed 30 s for workers to exit after SIGTERM)."""
    params = inspect.signature(agent_class.__init__).parameters
    return {"shutdown_timeout": shutdown_timeout} if "shutdown_timeout" in params else {}


def shutdown(base_shutdown: Callable[..., None], death_sig: Any, timeout: int) -> None:
    """Call torch's `_shutdown` with the wait for the workers' exit where it takes one (2.13; 2.11: 30 s)."""
    if "timeout" in inspect.signature(base_shutdown).parameters:
        base_shutdown(death_sig, timeout)
    else:
        base_shutdown(death_sig)


def worker_processes(agent: Any) -> Any:
    """A LocalElasticAgent's process context (None before the first start): `pids()`, `error_files`."""
    require(agent, "_pcontext")
    return agent._pcontext


@functools.cache
def dcp_stager_reusable() -> bool:
    """Whether one DCP `DefaultStager` can stage more than once (public API; tried, not read from the
    version): torch 2.11's closes its state-dict stager after each stage, clearing its deepcopy table, so a
    second save fails with `KeyError: <class 'type'>`; 2.13 keeps it (and its cached pinned buffers)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    stager = DefaultStager(StagingOptions(False, False, False, False))
    try:
        for _ in range(2):
            stager.stage({"tensor": torch.zeros(1), "number": 1})
    except KeyError:
        return False
    finally:
        stager.close()
    return True


def storage_alignment() -> int:
    return torch.serialization._get_storage_alignment()


def serialize_tensor(out: Any, tensor: torch.Tensor, alignment: int) -> None:
    """`torch.save(tensor, out)` without the zip's own CRC pass (the kit's file checksum covers the bytes)."""
    writer = torch._C.PyTorchFileWriter(out, False, alignment)
    try:
        torch.serialization._save(tensor, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    finally:
        # Always finalize here: an unfinished writer finalizes in its C++ destructor, and if that write
        # fails (disk full) the process aborts. After a failure `out` swallows the remaining bytes.
        with contextlib.suppress(RuntimeError):
            writer.write_end_of_file()


def local_shard(obj: Any) -> torch.Tensor | None:
    """A plain DTensor's local tensor read directly (None for anything else): `to_local()` is an autograd
    call per item, ~15 % of a small model's save in the writer thread."""
    from torch.distributed.tensor import DTensor

    if type(obj) is DTensor and type(obj._local_tensor) is torch.Tensor:
        obj._raise_if_contains_partial_placements()
        return obj._local_tensor
    return None


def forget_mesh_groups(mesh: Any) -> None:
    """Drop a DeviceMesh's process groups, and DTensor's sharding cache that keeps old meshes alive: without
    both, an aborted group's sockets stay open."""
    from torch.distributed.tensor import DTensor

    if mesh is not None:
        require(mesh, "_pg_registry")
        mesh._pg_registry.clear()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()


def abort_all_groups() -> None:
    """Abort every process group of this process (peers blocked in a collective with it fail at once)."""
    torch.distributed.distributed_c10d._abort_process_group()
