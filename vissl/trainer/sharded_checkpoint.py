"""Sharded checkpoints (``TRAINER.TASK_NAME: self_supervision_fsdp_task``) with
``torch.distributed.checkpoint`` (DCP).

In VISSL's folder layout, a checkpoint named ``model_phase{N}.torch`` (likewise
``model_iteration{N}.torch``, ``model_final_checkpoint_phase{N}.torch``) is two things:

- ``model_phase{N}.dcp/``: a DCP folder (one ``__{rank}_0.distcp`` file per rank and a
  ``.metadata``) with the tensors: ``model`` (the model's state dict, each parameter
  sharded), ``optimizer`` (keyed by parameter name, sharded like the parameters),
  ``loss`` (teachers, queues, centers) and ``hook_entries`` (e.g. ``ema_model``, the
  ``HOOKS.EMA_MODEL`` average, sharded like the model);
- ``model_phase{N}.torch``: a small index in the usual layout (``phase_idx``,
  ``iteration``, ``classy_state_dict`` with the RNG and meter states, the GradScaler, the
  hooks' states, ``config`` ...) without those tensors, plus
  ``checkpoint_format: "sharded_dcp"`` and ``sharded_dir`` (the folder's name).

Atomic: every rank writes into ``.tmp_model_phase{N}.dcp``; after all have finished,
rank 0 renames it, then writes the index atomically and moves the ``checkpoint.torch``
pointer. A checkpoint without its index is never picked for resume (the resume choice
reads the indexes only), and leftovers are removed by the next run.

DCP reshards on load: a checkpoint written by N processes resumes on M (M = 1 too,
where the model is not sharded). :func:`consolidate_sharded_checkpoint` turns one into a
single-file checkpoint in the usual layout (``extra_scripts/convert_sharded_checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from vissl.utils.checkpoint import (
    CheckpointLoadError,
    atomic_torch_save,
    load_checkpoint,
    save_checkpoint,
    split_model_state,
)
from vissl.utils.distributed import barrier, is_distributed, is_primary

logger = logging.getLogger(__name__)

#: ``checkpoint_format`` of a sharded checkpoint's index.
SHARDED_FORMAT = "sharded_dcp"

#: The task whose state is saved (typed loosely: the task module imports this one).
SelfSupervisionTask = Any


def sharded_dir_name(filename: str) -> str:
    """``model_phase3.torch`` -> ``model_phase3.dcp``."""
    stem = filename[: -len(".torch")] if filename.endswith(".torch") else filename
    return f"{stem}.dcp"


def is_sharded_checkpoint(state: dict[str, Any]) -> bool:
    """Whether a loaded checkpoint is the index of a sharded one."""
    return state.get("checkpoint_format") == SHARDED_FORMAT


def _dist_options() -> dict[str, Any]:
    return {} if is_distributed() else {"no_dist": True}


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _hook_entries(task: SelfSupervisionTask) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for hook in task.hooks:
        get_entries = getattr(hook, "checkpoint_entries", None)
        if callable(get_entries):
            entries.update(get_entries(task))
    return entries


def task_tensor_state(task: SelfSupervisionTask) -> dict[str, Any]:
    """The tensors of ``task`` a sharded checkpoint holds, as DCP state dicts (live views:
    loading into them fills the task)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: dict[str, Any] = {
        "model": get_model_state_dict(task.base_model),
        "loss": task.loss.state_dict(),
        "hook_entries": _hook_entries(task),
    }
    if task.optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(task.base_model, task.optimizer)
    return state


def save_sharded_checkpoint(
    task: SelfSupervisionTask, filename: str, index: dict[str, Any]
) -> str | None:
    """Write ``task``'s tensors with DCP, then ``index`` as ``filename`` (collective).

    Args:
        task: the task.
        filename: the index's name (``model_phase{N}.torch`` ...).
        index: the checkpoint's other contents (from ``checkpoint_state``, tensors left
            out).

    Returns:
        The index's path on rank 0, None elsewhere.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter

    folder = task.checkpoint_folder
    name = sharded_dir_name(filename)
    final = os.path.join(folder, name)
    tmp = os.path.join(folder, f".tmp_{name}")
    if is_primary():
        os.makedirs(folder, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    with _quiet_single_process():
        dcp.save(
            task_tensor_state(task),
            storage_writer=FileSystemWriter(tmp, sync_files=True),
            # replicated tensors (buffers, a loss's plain state) from rank 0, as a
            # consolidated checkpoint would hold them
            planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),
            **_dist_options(),
        )
    barrier()  # every rank's shard is on disk
    path = None
    if is_primary():
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        index = {**index, "checkpoint_format": SHARDED_FORMAT, "sharded_dir": name}
        path = save_checkpoint(folder, filename, index)
    barrier()
    return path


def load_sharded_into_task(
    task: SelfSupervisionTask, folder: str, state: dict[str, Any]
) -> dict[str, Any]:
    """Load a sharded checkpoint's tensors into ``task`` (collective), resharding them to
    this run's world size.

    Args:
        task: the built task.
        folder: the folder holding the checkpoint.
        state: its index (see :func:`is_sharded_checkpoint`).

    Returns:
        The hooks' checkpoint entries (to merge into ``classy_state_dict`` before the
        hooks' ``restore_checkpoint_entries``).

    Raises:
        CheckpointLoadError: the DCP folder is missing.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = os.path.join(folder, str(state["sharded_dir"]))
    if not os.path.isdir(path):
        raise CheckpointLoadError(f"sharded checkpoint folder {path!r} does not exist")
    target = task_tensor_state(task)
    target["hook_entries"] = _saved_entries(path, target["hook_entries"])
    with _quiet_single_process():
        dcp.load(target, checkpoint_id=path, **_dist_options())
    set_model_state_dict(task.base_model, target["model"])
    if task.optimizer is not None and "optimizer" in target:
        set_optimizer_state_dict(task.base_model, task.optimizer, target["optimizer"])
    task.loss.load_state_dict(target["loss"])
    logger.info("loaded the sharded checkpoint %s", path)
    return dict(target["hook_entries"])


def _saved_entries(path: str, entries: dict[str, Any]) -> dict[str, Any]:
    """The hooks' entries the checkpoint in ``path`` holds (a hook turned on since it was
    written, e.g. ``HOOKS.EMA_MODEL``, finds nothing to load and is told so by the
    missing entry)."""
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(path).read_metadata().state_dict_metadata
    present = {k.split(".", 2)[1] for k in saved if k.startswith("hook_entries.")}
    return {name: entry for name, entry in entries.items() if name in present}


def _model_layout(entry: Any) -> Any:
    """A hook entry in ``base_model``'s layout (``{"model": {"trunk", "heads", "other"},
    "meta"}``, e.g. the EMA model) with the empty parts DCP does not keep put back."""
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), dict):
        return entry
    model = entry["model"]
    parts = {part: dict(model.get(part, {})) for part in ("trunk", "heads", "other")}
    return {**entry, "model": parts, "meta": dict(entry.get("meta", {}))}


def read_sharded_tensors(path: str) -> dict[str, Any]:
    """Every tensor of a DCP folder, unsharded, on the CPU (no process group needed)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="vissl_consolidate_") as tmp:
        out = os.path.join(tmp, "full.torch")
        dcp_to_torch_save(path, out)
        return torch.load(out, map_location="cpu", weights_only=False)  # type: ignore[no-any-return]


def _optimizer_by_index(optimizer: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (DCP's) in torch's layout (by index, in
    the order of the param groups), which a single-process optimizer loads."""
    groups = optimizer.get("param_groups", [])
    index: dict[str, int] = {}
    for group in groups:
        for fqn in group["params"]:
            index.setdefault(fqn, len(index))
    state = {index[k]: v for k, v in optimizer.get("state", {}).items() if k in index}
    new_groups = [{**g, "params": [index[f] for f in g["params"]]} for g in groups]
    return {"state": state, "param_groups": new_groups}


def consolidate_sharded_checkpoint(index_path: str) -> dict[str, Any]:
    """A sharded checkpoint as one consolidated checkpoint in the usual layout
    (``classy_state_dict.base_model.model.{trunk,heads}``, ``loss``, ``optimizer`` ...).

    Args:
        index_path: the index (``model_phase{N}.torch``) or its ``.dcp`` folder.

    Raises:
        CheckpointLoadError: not a sharded checkpoint, or its folder is missing.
    """
    if os.path.isdir(index_path):
        stem = index_path.rstrip("/")
        stem = stem[: -len(".dcp")] if stem.endswith(".dcp") else stem
        index_path = f"{stem}.torch"
    state = load_checkpoint(index_path)
    if not is_sharded_checkpoint(state):
        raise CheckpointLoadError(
            f"{index_path!r} is not a sharded checkpoint (it has no sharded_dir): it is "
            "already consolidated."
        )
    folder = os.path.join(os.path.dirname(os.path.abspath(index_path)), state["sharded_dir"])
    if not os.path.isdir(folder):
        raise CheckpointLoadError(f"sharded checkpoint folder {folder!r} does not exist")
    tensors = read_sharded_tensors(folder)
    classy = dict(state["classy_state_dict"])
    classy["base_model"] = {
        "model": split_model_state(tensors.get("model", {})),
        "meta": dict(classy.get("base_model", {}).get("meta", {})),
    }
    classy["loss"] = tensors.get("loss", {})
    if "optimizer" in tensors:
        classy["optimizer"] = _optimizer_by_index(tensors["optimizer"])
    # e.g. the EMA model as classy_state_dict["ema_model"], as a DDP run writes it
    classy.update({k: _model_layout(v) for k, v in tensors.get("hook_entries", {}).items()})
    out = {k: v for k, v in state.items() if k not in ("checkpoint_format", "sharded_dir")}
    out["loss"] = classy["loss"]
    out["classy_state_dict"] = classy
    return out


def write_consolidated_checkpoint(index_path: str, out_path: str) -> str:
    """:func:`consolidate_sharded_checkpoint` written atomically to ``out_path``."""
    atomic_torch_save(consolidate_sharded_checkpoint(index_path), out_path)
    return out_path
