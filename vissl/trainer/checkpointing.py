"""Checkpointing, in one place: what a checkpoint holds, saving, the resume choice, loading.

- **Contents** (:func:`checkpoint_state`, :func:`restore_checkpoint_state`): VISSL's layout
  (``phase_idx``, ``iteration``, ``train_phase_idx``, ``iteration_num``, ``loss``,
  ``classy_state_dict`` with ``base_model.model.{trunk,heads}``, ``optimizer``,
  ``num_updates``, ``hooks`` ...) plus what exact resume needs: every rank's RNG and
  meter states (``per_rank``), the precision state (GradScaler), whether the phase was
  complete and its running loss, and the config as YAML. A hook may add its own entries
  to ``classy_state_dict`` (``checkpoint_entries(task) -> dict``) and read them back on
  resume (``restore_checkpoint_entries(task, classy_state_dict)``); with
  ``HOOKS.EMA_MODEL`` on, ``EmaHook`` adds ``"ema_model"`` in the layout of ``base_model``.
- **Saving** (:func:`save_task_checkpoint`): collective; every hook's ``before_save(task)``
  runs first, non-finite weights are refused, rank 0 writes atomically.
  :class:`~vissl.hooks.checkpoint_hooks.CheckpointHook` only decides *when*.
- **Resume choice** (:func:`choose_resume_checkpoint`): the newest checkpoint by the
  progress it records (not by file time), or the ``checkpoint.torch`` pointer with
  ``CHECKPOINT.USE_SYMLINK_CHECKPOINT_FOR_RESUME``.
- **Loading** (:func:`load_resume_checkpoint`, :func:`restore_or_initialise`): falls back to
  the previous checkpoint when the chosen one cannot be read; ``MODEL.WEIGHTS_INIT`` when
  there is nothing to resume.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from vissl.config.compare import describe_run, recorded_config
from vissl.errors import ResumeMismatchError
from vissl.hooks.base import hook_name
from vissl.trainer.sharded_checkpoint import (
    is_sharded_checkpoint,
    load_sharded_into_task,
    save_sharded_checkpoint,
)
from vissl.utils.checkpoint import (
    POINTER_NAME,
    CheckpointLoadError,
    detach_to_cpu,
    get_rng_state,
    has_final_checkpoint,
    join_model_state,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    set_rng_state,
    split_model_state,
)
from vissl.utils.distributed import (
    all_reduce_max,
    barrier,
    gather_object_to_primary,
    get_rank,
    get_world_size,
    is_primary,
)
from vissl.utils.hydra_config import config_to_yaml

#: The task these functions save and restore: a
#: :class:`~vissl.trainer.task.SelfSupervisionTask`. Typed loosely because the task
#: module imports this one (its ``save_checkpoint``/``state_dict``/``load_state_dict``).
SelfSupervisionTask = Any

logger = logging.getLogger(__name__)

#: Optimizer options that say how it runs, not what it computes.
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


# ---------------------------------------------------------------------- contents
def _hook_key(hook: Any) -> str:
    return hook_name(hook)


def _rank_state(task: SelfSupervisionTask) -> dict[str, Any]:
    """This rank's own state: RNGs, meter partial sums and the loss's per-rank state.

    A loss whose state differs between ranks (e.g. SwAV's per-rank queues) defines
    ``rank_state_dict()`` and ``load_rank_state_dict(state)``; what it returns is saved
    for every rank and given back to the same rank on resume.
    """
    meters = [
        detach_to_cpu(m.state_dict() if hasattr(m, "state_dict") else {}) for m in task.meters
    ]
    state: dict[str, Any] = {"rng": get_rng_state(), "meters": meters}
    rank_state_dict = getattr(task.loss, "rank_state_dict", None)
    if callable(rank_state_dict):
        state["loss"] = detach_to_cpu(rank_state_dict())
    return state


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state dict; a ZeRO optimizer's consolidated on rank 0 (collective),
    the rank that writes."""
    if optimizer is None:
        return {}
    from vissl.optimizers.zero import is_zero, zero_state_dict

    if is_zero(optimizer):
        return zero_state_dict(optimizer, is_primary())
    return optimizer.state_dict()  # type: ignore[no-any-return]


def checkpoint_state(
    task: SelfSupervisionTask, phase_complete: bool = True, include_tensors: bool = True
) -> dict[str, Any]:
    """Everything needed to resume ``task``, as tensors and plain containers.

    Collective with several processes (every rank must call it): per-rank RNG and meter
    states are gathered into ``classy_state_dict["per_rank"]`` on rank 0 (the rank that
    writes); the other ranks' ``per_rank`` holds their own state only.

    Args:
        task: the task to save.
        phase_complete: True at a phase end; False for an iteration checkpoint, which
            resumes inside the phase, after ``local_iteration_num`` batches.
        include_tensors: False for a sharded checkpoint's index: the model, optimizer,
            loss and the hooks' entries are left out (they are written with DCP, see
            :mod:`vissl.trainer.sharded_checkpoint`).
    """
    mine = _rank_state(task)
    gathered = gather_object_to_primary(mine)
    per_rank: list[dict[str, Any]] = gathered if gathered is not None else [mine]  # type: ignore[assignment]
    loss_sum, loss_count = task.phase_loss_state()
    if include_tensors:
        model_state = split_model_state(task.base_model.state_dict())
        optimizer_state = _optimizer_state(task.optimizer)
        loss_state = task.loss.state_dict()
    else:
        model_state, optimizer_state, loss_state = split_model_state({}), {}, {}
    classy_state = {
        "train": task.train,
        "base_model": {"model": model_state, "meta": {}},
        "meters": per_rank[0]["meters"],
        "optimizer": optimizer_state,
        "phase_idx": task.phase_idx,
        "train_phase_idx": task.train_phase_idx,
        "num_updates": task.num_updates,
        "losses": [],
        "hooks": {_hook_key(h): h.state_dict() for h in task.hooks if hasattr(h, "state_dict")},
        "loss": loss_state,
        "amp": task.precision.state_dict(),
        "phase_complete": phase_complete,
        "phase_loss": {"sum": loss_sum, "count": loss_count},
        "world_size": get_world_size(),
        "per_rank": per_rank,
    }
    for hook in task.hooks if include_tensors else ():
        # A hook's own entries of classy_state_dict (e.g. EmaHook's "ema_model").
        entries = getattr(hook, "checkpoint_entries", None)
        if callable(entries):
            classy_state.update(entries(task))
    return {
        "phase_idx": task.phase_idx,
        "iteration": task.iteration,
        "train_phase_idx": task.train_phase_idx,
        "iteration_num": task.local_iteration_num,
        "loss": loss_state,
        "config": config_to_yaml(task.config),
        "classy_state_dict": classy_state,
    }


def resume_mismatch_error(
    folder: str, checkpoint_path: str, recorded: Any, current: Any, detail: str
) -> ResumeMismatchError:
    """The error of a resume into a folder whose checkpoint is another model's."""
    return ResumeMismatchError(
        f"config.CHECKPOINT.DIR={folder} holds a checkpoint of another model: "
        f"{os.path.basename(checkpoint_path)} was written by a run of "
        f"{describe_run(recorded)}; this config is {describe_run(current)} ({detail}). "
        "Resuming it would train the wrong weights, so nothing in the folder was changed. "
        "To train this config, give it its own folder (config.CHECKPOINT.DIR=<new "
        "folder>); to start it from scratch in this folder, set "
        "config.CHECKPOINT.AUTO_RESUME=false (the old run's files are moved to "
        f"{os.path.join(folder, 'previous_runs')}/<time>/); to start from that model's "
        f"weights, use a new folder and config.MODEL.WEIGHTS_INIT.PARAMS_FILE={checkpoint_path}."
    )


def _model_fit_problems(task: SelfSupervisionTask, classy: dict[str, Any]) -> str | None:
    """Why the checkpoint's model weights do not load into the task's model, or None."""
    try:
        saved = join_model_state(classy["base_model"]["model"])
    except (KeyError, TypeError, AttributeError):
        return "it holds no vissl model (classy_state_dict.base_model.model)"
    expected = {k: tuple(v.shape) for k, v in task.base_model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in saved.items() if hasattr(v, "shape")}
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    problems = []
    if missing:
        problems.append(f"{len(missing)} weights of this model are not in it ({missing[:3]})")
    if unexpected:
        problems.append(f"it has {len(unexpected)} weights this model lacks ({unexpected[:3]})")
    if shapes:
        k = shapes[0]
        problems.append(
            f"{len(shapes)} weights have other shapes ({k}: {list(got[k])} in the "
            f"checkpoint, {list(expected[k])} here)"
        )
    return "; ".join(problems) or None


def check_checkpoint_fits(task: SelfSupervisionTask, state: dict[str, Any], path: str) -> None:
    """Refuse a checkpoint whose model weights do not fit the task's model.

    Raises:
        ResumeMismatchError: naming the checkpoint's run and how to start a new one.
    """
    if is_sharded_checkpoint(state):
        return  # (its tensors are in its DCP folder; loading them says what does not fit)
    problem = _model_fit_problems(task, state.get("classy_state_dict") or {})
    if problem is not None:
        raise resume_mismatch_error(
            os.path.dirname(path),
            path,
            recorded_config(state.get("config")),
            task.config,
            f"the checkpoint does not fit this model: {problem}",
        )


def restore_checkpoint_state(
    task: SelfSupervisionTask,
    state: dict[str, Any],
    folder: str | None = None,
    path: str | None = None,
) -> None:
    """Restore a checkpoint written by :func:`checkpoint_state` into a built task.

    A phase-end checkpoint resumes at the next phase. An iteration checkpoint re-enters
    its phase and skips the batches already trained on (``task.pending_resume``, applied
    by :func:`restore_mid_phase` once the phase's data iterator exists).

    Args:
        task: the built task.
        state: the loaded checkpoint (a sharded checkpoint's index: its tensors are
            loaded from its DCP folder, resharded to this run's world size; collective).
        folder: the folder the checkpoint is in (default: the task's).
        path: the checkpoint's file, named in errors.

    Raises:
        ResumeMismatchError: the checkpoint's model, optimizer or loss state does not fit
            the task (another model's checkpoint).
    """
    if path is None:
        where = folder or getattr(task, "checkpoint_folder", None) or "."
        path = os.path.join(where, POINTER_NAME)
    check_checkpoint_fits(task, state, path)
    if is_sharded_checkpoint(state):
        _restore_checkpoint_state(task, state, folder)  # (collective: errors as they are)
        return
    try:
        _restore_checkpoint_state(task, state, folder)
    except (RuntimeError, KeyError, ValueError, IndexError) as err:
        if isinstance(err, ResumeMismatchError):
            raise
        detail = " ".join(str(err).split())[:400]
        raise resume_mismatch_error(
            os.path.dirname(path),
            path,
            recorded_config(state.get("config")),
            task.config,
            f"its state does not load into this run: {type(err).__name__}: {detail}",
        ) from err


def _restore_checkpoint_state(
    task: SelfSupervisionTask, state: dict[str, Any], folder: str | None
) -> None:
    classy = state["classy_state_dict"]
    # The implementation (fused / foreach) is this run's choice, from where its
    # parameters live, not the choice of the run that wrote the checkpoint.
    impl = [
        {k: g[k] for k in _IMPLEMENTATION_KEYS if k in g}
        for g in (task.optimizer.param_groups if task.optimizer is not None else [])
    ]
    sharded = is_sharded_checkpoint(state)
    if sharded:
        entries = load_sharded_into_task(task, folder or task.checkpoint_folder, state)
        classy = {**classy, **entries}
    else:
        task.base_model.load_state_dict(join_model_state(classy["base_model"]["model"]))
    for hook in task.hooks:
        restore = getattr(hook, "restore_checkpoint_entries", None)
        if callable(restore):
            restore(task, classy)
    if not sharded:
        if task.optimizer is not None and classy.get("optimizer"):
            task.optimizer.load_state_dict(classy["optimizer"])
        task.loss.load_state_dict(classy.get("loss", state.get("loss", {})))
    for group, keep in zip(
        task.optimizer.param_groups if task.optimizer is not None else [], impl, strict=False
    ):
        group.update(keep)
    task.precision.load_state_dict(classy.get("amp", {}))
    hook_states = classy.get("hooks", {})
    for h in task.hooks:
        if _hook_key(h) in hook_states and hasattr(h, "load_state_dict"):
            h.load_state_dict(hook_states[_hook_key(h)])
    task.phase_idx = int(classy["phase_idx"])
    task.train_phase_idx = int(classy["train_phase_idx"])
    task.num_updates = int(classy["num_updates"])
    task.iteration = int(state["iteration"])

    per_rank = classy.get("per_rank") or []
    rank = get_rank()
    mine = per_rank[rank] if rank < len(per_rank) else (per_rank[0] if per_rank else {})
    if per_rank and len(per_rank) != get_world_size():
        logger.warning(
            "checkpoint was written by %d processes, this run has %d: RNG and meter states "
            "of rank 0 are used, so the run continues but is not bitwise reproducible.",
            len(per_rank),
            get_world_size(),
        )
    load_rank_state = getattr(task.loss, "load_rank_state_dict", None)
    if callable(load_rank_state) and "loss" in mine:
        if len(per_rank) == get_world_size():
            load_rank_state(mine["loss"])
        else:
            logger.warning(
                "the loss's per-rank state (e.g. queues) is not restored: the checkpoint "
                "has %d ranks' states, this run %d ranks; it starts afresh.",
                len(per_rank),
                get_world_size(),
            )
    if classy.get("phase_complete", True):
        if "rng" in mine:
            set_rng_state(mine["rng"])
        task.pending_resume = None
    else:
        # Re-enter the phase: the trainer advances to phase_idx again and skips the
        # batches already seen; RNG states are restored after the data iterator exists.
        task.phase_idx -= 1
        if classy["train"]:
            task.train_phase_idx -= 1
        task.pending_resume = {
            "start_iter": int(state["iteration_num"]),
            "phase_loss": classy.get("phase_loss", {"sum": 0.0, "count": 0}),
            "meters": mine.get("meters", []),
            "rng": mine.get("rng"),
        }


def restore_mid_phase(task: SelfSupervisionTask) -> None:
    """Called by the trainer right after the data iterator of a resumed phase exists."""
    pending = task.pending_resume
    if pending is None:
        return
    task.local_iteration_num = pending["start_iter"]
    loss_count = pending["phase_loss"]["count"]  # a total weight (float) with loss_weight
    task.set_phase_loss(
        float(pending["phase_loss"]["sum"]),
        loss_count if isinstance(loss_count, int) else float(loss_count),
    )
    for meter, meter_state in zip(task.meters, pending["meters"], strict=False):
        if hasattr(meter, "load_state_dict") and meter_state:
            meter.load_state_dict(meter_state)
    if pending["rng"] is not None:
        set_rng_state(pending["rng"])
    task.pending_resume = None


# ---------------------------------------------------------------------- saving
def _run_before_save(task: SelfSupervisionTask) -> None:
    """Every hook's ``before_save(task)``, in hook order (e.g. a pending NaN check)."""
    for hook in task.dispatcher.hooks:
        before_save = getattr(hook, "before_save", None)
        if callable(before_save):
            before_save(task)


def _non_finite_parameters(task: SelfSupervisionTask) -> list[str]:
    """Names of parameters/buffers with NaN or Inf (one device read for the whole model).

    Of a sharded model each rank checks its shards and the ranks agree (collective).
    """
    from vissl.trainer.fsdp import is_sharded, local_tensor

    named = [
        (n, local_tensor(t))
        for n, t in task.base_model.state_dict().items()
        if t.is_floating_point()
    ]
    if not named:
        return []
    bad = torch.stack([~torch.isfinite(t).all() for _, t in named])
    if is_sharded(task.base_model):
        bad = all_reduce_max(bad.to(torch.uint8)).bool()
    return [n for (n, _), flag in zip(named, bad.tolist(), strict=True) if flag]


def save_task_checkpoint(
    task: SelfSupervisionTask, filename: str, phase_complete: bool = True, keep_last: int = -1
) -> str | None:
    """Write ``task``'s state as ``task.checkpoint_folder/filename`` (collective).

    Rank 0 writes (atomically, then moves the ``checkpoint.torch`` pointer); the others
    wait. Never writes from non-finite weights: raises ``FloatingPointError`` naming
    them, and the previous checkpoint stays the newest.

    Returns:
        The path written on rank 0, None on the other ranks.
    """
    _run_before_save(task)
    bad = _non_finite_parameters(task)
    if bad:
        raise FloatingPointError(
            f"refusing to write {filename}: non-finite values in {bad[:10]} at iteration "
            f"{task.iteration}. The previous checkpoint is kept; resume from it with a lower "
            "learning rate."
        )
    folder = task.checkpoint_folder
    if getattr(task, "sharded_checkpoints", False):
        index = checkpoint_state(task, phase_complete=phase_complete, include_tensors=False)
        path = save_sharded_checkpoint(task, filename, detach_to_cpu(index))  # collective
        if is_primary():
            removed = prune_checkpoints(folder, keep_last, protect=filename)
            if removed:
                logger.info("removed old checkpoints %s (KEEP_LAST_N_CHECKPOINTS)", removed)
        barrier()
        task.checkpoints_written.append(os.path.join(folder, filename))
        return path
    state = checkpoint_state(task, phase_complete=phase_complete)  # collective
    path = None
    if is_primary():
        # CPU tensors: the file loads anywhere, also without the GPU it was written on
        path = save_checkpoint(folder, filename, detach_to_cpu(state))
        removed = prune_checkpoints(folder, keep_last, protect=filename)
        if removed:
            logger.info("removed old checkpoints %s (CHECKPOINT.KEEP_LAST_N_CHECKPOINTS)", removed)
    barrier()
    task.checkpoints_written.append(os.path.join(folder, filename))
    return path


def save_iteration_checkpoint(task: SelfSupervisionTask) -> str | None:
    """An iteration checkpoint of a train phase, resumable mid-phase (collective)."""
    return save_task_checkpoint(
        task, f"model_iteration{task.iteration}.torch", phase_complete=False
    )


# ---------------------------------------------------------------------- resume choice
@dataclass(frozen=True)
class ResumeChoice:
    """What a new run in a checkpoint folder starts from.

    Attributes:
        checkpoint_path: the checkpoint to resume from, or None to start afresh.
        finished: training in this folder already finished (a final checkpoint exists
            and ``CHECKPOINT.OVERWRITE_EXISTING`` is off): there is nothing to do.
    """

    checkpoint_path: str | None = None
    finished: bool = False


def find_resume_checkpoint(folder: str, nth_latest: int = 1) -> str | None:
    """The ``nth_latest`` newest readable checkpoint by recorded progress, or None."""
    unreadable: list[str] = []
    ckpts = list_checkpoints(folder, unreadable)
    if unreadable:
        logger.warning(
            "checkpoints %s in %s cannot be read (truncated or corrupt) and are skipped",
            unreadable,
            folder,
        )
    if not ckpts:
        return None
    index = min(max(1, nth_latest), len(ckpts))
    return os.path.join(folder, ckpts[-index][2])


def choose_resume_checkpoint(cfg: Any, folder: str, engine_name: str = "train") -> ResumeChoice:
    """The resume choice of a run (``CHECKPOINT.*`` keys), made once by the launcher."""
    if engine_name != "train":
        return ResumeChoice()
    ckpt = cfg.CHECKPOINT
    if has_final_checkpoint(folder):
        if not ckpt.OVERWRITE_EXISTING:
            return ResumeChoice(finished=True)
        return ResumeChoice()  # train again from scratch, as asked
    if not ckpt.AUTO_RESUME:
        return ResumeChoice()
    pointer = os.path.join(folder, POINTER_NAME)
    if ckpt.USE_SYMLINK_CHECKPOINT_FOR_RESUME and os.path.lexists(pointer):
        target = os.path.join(folder, os.readlink(pointer))
        if os.path.exists(target):
            return ResumeChoice(checkpoint_path=target)
        logger.warning("%s points to a missing file; choosing by recorded progress", pointer)
    nth = int(ckpt.LATEST_CHECKPOINT_RESUME_FILE_NUM)
    return ResumeChoice(checkpoint_path=find_resume_checkpoint(folder, nth))


# ---------------------------------------------------------------------- loading
def load_resume_checkpoint(preferred: str) -> tuple[str, dict[str, Any]]:
    """Load ``preferred``; if it cannot be read, fall back to older checkpoints beside it.

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


def restore_or_initialise(task: SelfSupervisionTask, checkpoint_path: str | None) -> None:
    """Resume ``task`` from ``checkpoint_path``, else apply ``MODEL.WEIGHTS_INIT`` if set."""
    if checkpoint_path:
        path, state = load_resume_checkpoint(checkpoint_path)
        logger.info("resuming from %s (iteration %d)", path, int(state["iteration"]))
        restore_checkpoint_state(task, state, os.path.dirname(path), path)
    elif task.config.MODEL.WEIGHTS_INIT.PARAMS_FILE and not getattr(
        task, "weights_initialised", False
    ):
        from vissl.utils.weights_init import init_model_from_weights_params_file

        init_model_from_weights_params_file(task.base_model, task.config.MODEL.WEIGHTS_INIT)
        reset_momentum_copies(task)


def reset_momentum_copies(task: SelfSupervisionTask) -> int:
    """Make every momentum copy of the model equal to it again (after ``WEIGHTS_INIT``).

    The loss made its copies (MoCo's key encoder, DINO's teacher, SwAV's momentum
    encoder) from the random init when the task was built; the weights loaded since
    then must be their starting point too. Copies held by hooks (``EmaHook``) are reset
    as well. Returns the number of copies reset.
    """
    from vissl.models.momentum import momentum_copies, reset_momentum_copy_

    copies = [c for owner in (task.loss, *task.hooks) for c in momentum_copies(owner)]
    for target in copies:
        reset_momentum_copy_(target, task.base_model)
    if copies:
        logger.info(
            "%d momentum copies (teacher / key encoder / EMA) start from MODEL.WEIGHTS_INIT",
            len(copies),
        )
    return len(copies)
