"""Checkpoint files: atomic writes, the ``checkpoint.torch`` pointer, safe loads, resume lookup.

Folder layout (VISSL's): ``model_phase{N}.torch``, ``model_iteration{N}.torch``,
``model_final_checkpoint_phase{N}.torch`` and ``checkpoint.torch``, a pointer (symlink)
to the newest file. Writes go to a temporary file in the same folder, are fsynced, then
renamed into place, and only then is the pointer moved: a reader never sees a half-written
checkpoint. Loads use ``torch.load(weights_only=True)``: a checkpoint holds tensors and
plain containers only, so loading never runs pickled code.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from iopath.common.file_io import g_pathmgr

from vissl.errors import VisslError

logger = logging.getLogger(__name__)

POINTER_NAME = "checkpoint.torch"
_UMASK = os.umask(0)
os.umask(_UMASK)
_PATTERNS = {
    "final": re.compile(r"^model_final_checkpoint_phase(\d+)\.torch$"),
    "phase": re.compile(r"^model_phase(\d+)\.torch$"),
    "iteration": re.compile(r"^model_iteration(\d+)\.torch$"),
}


class CheckpointLoadError(VisslError, RuntimeError):
    """A checkpoint file cannot be read safely."""


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` via a temporary file, fsync and rename."""
    folder = os.path.dirname(os.path.abspath(path))
    g_pathmgr.mkdirs(folder)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".torch", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; honour the umask instead
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def update_pointer(folder: str, filename: str) -> None:
    """Point ``checkpoint.torch`` at ``filename`` (atomically replaces the old pointer)."""
    pointer = os.path.join(folder, POINTER_NAME)
    tmp = os.path.join(folder, f".tmp_pointer_{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(filename, tmp)
    os.replace(tmp, pointer)
    _fsync_dir(folder)


def save_checkpoint(folder: str, filename: str, state: Mapping[str, Any]) -> str:
    """Write ``state`` to ``folder/filename`` atomically and move the pointer to it."""
    path = os.path.join(folder, filename)
    atomic_torch_save(dict(state), path)
    update_pointer(folder, filename)
    logger.info("saved checkpoint %s", path)
    return path


def _is_zip_file(path: str) -> bool:
    """Whether ``path`` is in torch's zip format (the only one ``mmap=True`` can read)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointLoadError: if the file is missing, truncated, or holds pickled objects.
    """
    try:
        if "://" not in path and str(map_location) == "cpu" and _is_zip_file(path):
            # A local file is memory-mapped: tensors are read when used (copied into the
            # model), not all at once; copy-on-write, so the file is never changed.
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # type: ignore[no-any-return]
        with g_pathmgr.open(path, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=True)  # type: ignore[no-any-return]
    except FileNotFoundError as err:
        raise CheckpointLoadError(f"checkpoint {path!r} does not exist") from err
    except Exception as err:
        raise CheckpointLoadError(
            f"checkpoint {path!r} cannot be loaded safely (weights_only=True): {err}. "
            "It is truncated, corrupt, or holds pickled Python objects, which vissl "
            "refuses to run."
        ) from err


def checkpoint_progress(path: str) -> tuple[int, int, int] | None:
    """``(iteration, phase_idx, phase_complete)`` recorded in a checkpoint, or None if unreadable.

    The file is memory-mapped, so only its small metadata is read, not its tensors.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        classy = state.get("classy_state_dict", {})
        complete = bool(classy.get("phase_complete", True))
        return int(state["iteration"]), int(state["phase_idx"]), int(complete)
    except Exception:  # truncated, corrupt, foreign: not a candidate
        return None


def checkpoint_config(path: str) -> str | None:
    """The config a checkpoint records (YAML text of its ``config`` entry), or None.

    Memory-mapped like :func:`checkpoint_progress`: the tensors are not read.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    text = state.get("config") if isinstance(state, dict) else None
    return text if isinstance(text, str) else None


def list_checkpoints(
    folder: str, unreadable: list[str] | None = None
) -> list[tuple[str, int, str]]:
    """``(kind, number, filename)`` of every readable checkpoint in ``folder``, oldest first.

    Ordered by the training progress each file records (iteration, then phase, then
    whether the phase was complete), never by modification time: copying a folder
    without ``-p`` or clock skew on a shared file system does not change the order.
    Unreadable files (truncated, corrupt) are left out; their names are appended to
    ``unreadable`` when given.
    """
    if not g_pathmgr.exists(folder):
        return []
    found = []
    for name in g_pathmgr.ls(folder):
        for kind, pattern in _PATTERNS.items():
            m = pattern.match(name)
            if m:
                progress = checkpoint_progress(os.path.join(folder, name))
                if progress is not None:
                    found.append((progress, kind != "final", kind, int(m.group(1)), name))
                elif unreadable is not None:
                    unreadable.append(name)
    # At equal progress a final checkpoint counts as newer than a phase checkpoint.
    found.sort(key=lambda f: (f[0], not f[1]))
    return [(kind, num, name) for _, _, kind, num, name in found]


def has_final_checkpoint(folder: str) -> bool:
    """Whether ``folder`` holds a ``model_final_checkpoint_phase{N}.torch``."""
    if not g_pathmgr.exists(folder):
        return False
    return any(_PATTERNS["final"].match(name) for name in g_pathmgr.ls(folder))


def split_model_state(model_state: dict[str, Any]) -> dict[str, Any]:
    """A model's flat state dict in VISSL's layout: ``{"trunk", "heads", "other"}``."""
    trunk = {k[len("trunk.") :]: v for k, v in model_state.items() if k.startswith("trunk.")}
    heads = {k[len("heads.") :]: v for k, v in model_state.items() if k.startswith("heads.")}
    other = {k: v for k, v in model_state.items() if not k.startswith(("trunk.", "heads."))}
    return {"trunk": trunk, "heads": heads, "other": other}


def join_model_state(model: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_model_state`."""
    full = {f"trunk.{k}": v for k, v in model["trunk"].items()}
    full.update({f"heads.{k}": v for k, v in model["heads"].items()})
    full.update(model.get("other", {}))
    return full


def detach_to_cpu(obj: Any) -> Any:
    """Tensors (nested in dicts, lists, tuples) detached and copied to CPU, for saving."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: detach_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(detach_to_cpu(v) for v in obj)
    return obj


# ---------------------------------------------------------------------- RNG state
def get_rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) RNG states as tensors and plain containers."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)  # type: ignore[misc]
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": [*internal, version, gauss_next],
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # The current device's generator only: a process trains on one GPU, and saving
        # every visible device's makes a resume with fewer visible GPUs fail.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _cuda_rng_of_this_device(saved: Any) -> torch.Tensor | None:
    """The saved CUDA generator state for this process's device.

    Checkpoints written before vissl saved one device's state hold a list with one
    state per visible device: the current device's entry is taken (the first one when
    fewer devices are visible now).
    """
    if isinstance(saved, torch.Tensor):
        return saved
    if isinstance(saved, list | tuple) and saved:
        index = torch.cuda.current_device()
        return saved[index] if index < len(saved) else saved[0]  # type: ignore[no-any-return]
    return None


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[-2], tuple(int(x) for x in py[:-2]), py[-1]))
    npst = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            npst["keys"].numpy().astype(np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_state = _cuda_rng_of_this_device(state["cuda"])
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state)  # the current device


def _sharded_dir(folder: str, filename: str) -> str:
    """The DCP folder of a sharded checkpoint named ``filename`` (it may not exist)."""
    return os.path.join(folder, filename.removesuffix(".torch") + ".dcp")


def remove_stale_temporary_files(folder: str) -> None:
    """Delete leftovers of writes that were killed before their rename: temporary files
    and folders, and sharded checkpoint folders (``*.dcp``) whose index was never
    written."""
    if not os.path.isdir(folder):
        return
    names = set(os.listdir(folder))
    for name in names:
        path = os.path.join(folder, name)
        orphan = name.endswith(".dcp") and name.removesuffix(".dcp") + ".torch" not in names
        if name.startswith((".tmp_", ".tmp_pointer_")) or orphan:
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError:
                pass


def prune_checkpoints(folder: str, keep_last: int, protect: str) -> list[str]:
    """Keep the ``keep_last`` newest phase/iteration checkpoints; never the final or ``protect``."""
    if keep_last <= 0:
        return []
    intermediate = [(k, n) for k, _, n in list_checkpoints(folder) if k != "final"]
    removed = []
    for _, name in intermediate[:-keep_last]:
        if name == protect:
            continue
        os.unlink(os.path.join(folder, name))
        shutil.rmtree(_sharded_dir(folder, name), ignore_errors=True)
        removed.append(name)
    return removed
