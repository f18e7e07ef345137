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


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointLoadError: if the file is missing, truncated, or holds pickled objects.
    """
    try:
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


def list_checkpoints(folder: str) -> list[tuple[str, int, str]]:
    """``(kind, number, filename)`` of every checkpoint in ``folder``, oldest first.

    Ordered by training progress: iteration checkpoints are placed by their iteration
    within phases by file modification time, which matches the order they were written.
    """
    if not g_pathmgr.exists(folder):
        return []
    found = []
    for name in g_pathmgr.ls(folder):
        for kind, pattern in _PATTERNS.items():
            m = pattern.match(name)
            if m:
                mtime = os.stat(os.path.join(folder, name)).st_mtime_ns
                found.append((mtime, kind, int(m.group(1)), name))
    found.sort()
    return [(kind, num, name) for _, kind, num, name in found]


def has_final_checkpoint(folder: str) -> bool:
    return any(kind == "final" for kind, _, _ in list_checkpoints(folder))


def find_resume_checkpoint(folder: str, nth_latest: int = 1) -> str | None:
    """The checkpoint to resume from: the ``nth_latest`` newest, or None."""
    ckpts = list_checkpoints(folder)
    if not ckpts:
        return None
    index = max(1, nth_latest)
    if index > len(ckpts):
        index = len(ckpts)
    return os.path.join(folder, ckpts[-index][2])


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
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


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
        torch.cuda.set_rng_state_all(state["cuda"])


def load_resume_checkpoint(preferred: str) -> tuple[str, dict[str, Any]]:
    """Load ``preferred``; if it is unreadable, fall back to older checkpoints beside it.

    Returns:
        ``(path actually loaded, state)``.

    Raises:
        CheckpointLoadError: when no checkpoint in the folder can be loaded.
    """
    try:
        return preferred, load_checkpoint(preferred)
    except CheckpointLoadError as first_error:
        folder = os.path.dirname(preferred)
        names = [name for _, _, name in list_checkpoints(folder)]
        target = os.path.basename(os.path.realpath(preferred))
        older = names[: names.index(target)] if target in names else names
        for name in reversed(older):
            path = os.path.join(folder, name)
            try:
                state = load_checkpoint(path)
            except CheckpointLoadError:
                continue
            logger.warning(
                "checkpoint %s cannot be loaded (%s); resuming from the previous one, %s",
                preferred,
                first_error,
                path,
            )
            return path, state
        raise


def remove_stale_temporary_files(folder: str) -> None:
    """Delete leftovers of writes that were killed before their rename."""
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if name.startswith((".tmp_", ".tmp_pointer_")):
            try:
                os.unlink(os.path.join(folder, name))
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
        removed.append(name)
    return removed
