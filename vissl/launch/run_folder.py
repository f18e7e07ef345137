"""What a training run does with its ``CHECKPOINT.DIR``, decided once by rank 0 under the
folder's lock (:mod:`vissl.launch.run_lock`), before anything in the folder changes.

- **A finished run** (a ``model_final_checkpoint_phase*.torch``) of the same config
  (:func:`vissl.config.compare.config_differences` finds no difference in what it trains):
  nothing to do, as in VISSL. Of another config: refused with
  :class:`~vissl.errors.RunFolderError`, unless ``CHECKPOINT.OVERWRITE_EXISTING`` asks to
  train again; then the finished run is moved aside (:func:`move_run_aside`), never
  deleted, and this config trains from scratch.
- **An unfinished run, AUTO_RESUME on**: resume from its newest checkpoint
  (:func:`~vissl.trainer.checkpointing.choose_resume_checkpoint`), unless the checkpoint
  records another model (:data:`vissl.config.compare.MODEL_KEYS`: loss, trunk, heads):
  then :class:`~vissl.errors.ResumeMismatchError`. Other changed keys are allowed and
  named in a warning. The trainer checks again that the weights fit the built model,
  before ``train_config.yaml`` or ``log.txt`` is written.
- **A fresh start** (``AUTO_RESUME`` off, or no readable checkpoint) in a folder that
  holds another run's files: they are moved aside first, so no checkpoint is overwritten
  and no log or metrics file mixes two runs.

Moving aside renames vissl's run files (:func:`run_files`: checkpoints, logs, metrics,
TensorBoard events, ``train_config.yaml``) into ``CHECKPOINT.DIR/previous_runs/<time>/``;
other files in the folder (``CHECKPOINT.DIR: "."`` is the current folder) stay.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime
from typing import Any

from vissl.config.attr_dict import AttrDict
from vissl.config.compare import (
    MODEL_KEYS,
    config_differences,
    describe_run,
    format_differences,
    recorded_config,
)
from vissl.config.derive import derived_config
from vissl.errors import RunFolderError
from vissl.trainer.checkpointing import (
    ResumeChoice,
    choose_resume_checkpoint,
    resume_mismatch_error,
)
from vissl.utils.checkpoint import checkpoint_config, has_final_checkpoint, list_checkpoints

logger = logging.getLogger(__name__)

#: Where moved-aside runs go, inside ``CHECKPOINT.DIR``.
PREVIOUS_RUNS = "previous_runs"

#: The files and folders a vissl run writes at the top of its ``CHECKPOINT.DIR``.
RUN_FILE = re.compile(
    r"^(?:"
    r"model_(?:final_checkpoint_phase|phase|iteration)\d+\.(?:torch|dcp)"
    r"|checkpoint\.torch|train_config\.yaml|log\.txt|stdout\.json|metrics\.json"
    r"|summary\.json|tensorboard"
    r"|rank\d+_(?:input_sample|model_output)\.pth|memory_dump_rank\d+\.txt"
    r"|profiler_\w+_rank\d+\.\w+"
    r")$"
)
_FINAL = re.compile(r"^model_final_checkpoint_phase\d+\.torch$")

_KEY = "config.CHECKPOINT"


def run_files(folder: str) -> list[str]:
    """The names of vissl's run files at the top of ``folder``, sorted."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if RUN_FILE.match(name))


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


def move_run_aside(folder: str) -> str | None:
    """Move the run files of ``folder`` into ``folder/previous_runs/<time>/``.

    Each file is renamed (nothing is copied or rewritten, so every file keeps its bytes);
    the final checkpoints go last, so an interrupted move leaves a folder that still
    reads as finished. Returns the new folder, or None when there was nothing to move.
    """
    names = run_files(folder)
    if not names:
        return None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    dest = os.path.join(folder, PREVIOUS_RUNS, stamp)
    n = 1
    while os.path.exists(dest):
        dest = os.path.join(folder, PREVIOUS_RUNS, f"{stamp}-{n}")
        n += 1
    os.makedirs(dest)
    order = sorted(names, key=lambda name: (bool(_FINAL.match(name)), name))
    for name in order:
        os.rename(os.path.join(folder, name), os.path.join(dest, name))
    _fsync_dir(dest)
    _fsync_dir(folder)
    return dest


def as_recorded(cfg: Any) -> AttrDict:
    """``cfg`` as a checkpoint or ``train_config.yaml`` records it: with what the loss
    infers from the rest of the config (:func:`vissl.config.derive.derived_config`), on a
    copy."""
    return derived_config(cfg)


def _train_config(folder: str) -> dict[str, Any] | None:
    """``train_config.yaml``'s config: the run's config as given (before the task filled
    in what it infers), written once its resume fitted."""
    path = os.path.join(folder, "train_config.yaml")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return recorded_config(f.read())


def run_differences(
    cfg: Any, folder: str, checkpoint: str | None = None
) -> tuple[dict[str, Any] | None, list[tuple[str, Any, Any]]]:
    """``(the folder's run config, how cfg differs from it)`` in what a run trains.

    ``train_config.yaml`` is compared with ``cfg`` as given; without it (a folder of
    checkpoints only), the config ``checkpoint`` (default: the newest final one) records,
    with what the task inferred, is compared with ``cfg`` in the same form
    (:func:`as_recorded`). ``(None, [])`` when neither is there.
    """
    given = _train_config(folder)
    if given is not None:
        # train_config.yaml holds the derived values (written by older versions without
        # them): both sides are compared derived
        return given, config_differences(as_recorded(given), as_recorded(cfg))
    if checkpoint is None:
        finals = [name for kind, _, name in list_checkpoints(folder) if kind == "final"]
        checkpoint = os.path.join(folder, finals[-1]) if finals else None
    recorded = recorded_config(checkpoint_config(checkpoint)) if checkpoint else None
    if recorded is None:
        return None, []
    return recorded, config_differences(recorded, as_recorded(cfg))


def _final_name(folder: str) -> str:
    finals = sorted(n for n in os.listdir(folder) if _FINAL.match(n))
    return finals[-1] if finals else "a final checkpoint"


def finished_run_error(
    folder: str, recorded: dict[str, Any], cfg: Any, diffs: list[tuple[str, Any, Any]]
) -> RunFolderError:
    return RunFolderError(
        f"config.CHECKPOINT.DIR={folder} holds a finished run of another config "
        f"({describe_run(recorded)}; {_final_name(folder)}), and this config differs: "
        f"{format_differences(diffs)}. Nothing in the folder was changed. To train this "
        "config, give it its own folder (config.CHECKPOINT.DIR=<new folder>), or set "
        f"{_KEY}.OVERWRITE_EXISTING=true to move the finished run to "
        f"{os.path.join(folder, PREVIOUS_RUNS)}/<time>/ and train this config from scratch "
        "in the folder."
    )


def check_resume_identity(cfg: Any, folder: str, checkpoint_path: str) -> None:
    """Refuse a checkpoint of another model; warn about the other keys changed since.

    Raises:
        ResumeMismatchError: the checkpoint records another loss, trunk or heads.
    """
    recorded = recorded_config(checkpoint_config(checkpoint_path))
    if recorded is None:
        return  # (a checkpoint without its config: the trainer checks the weights fit)
    mismatch = config_differences(recorded, as_recorded(cfg), keys=MODEL_KEYS, ignore=())
    if mismatch:
        raise resume_mismatch_error(
            folder, checkpoint_path, recorded, cfg, format_differences(mismatch)
        )
    _, changed = run_differences(cfg, folder, checkpoint_path)
    if changed:
        logger.warning(
            "resuming %s with settings changed since it was written: %s",
            checkpoint_path,
            format_differences(changed, limit=10),
        )


def _moved(folder: str, why: str) -> None:
    dest = move_run_aside(folder)
    if dest is not None:
        logger.warning("%s: the files of the run in %s were moved to %s", why, folder, dest)


def prepare_train_folder(cfg: Any, folder: str) -> ResumeChoice:
    """Rank 0's decision for a training run in ``folder`` (see the module docstring);
    the caller holds the folder's lock.

    Raises:
        RunFolderError: a finished run of another config, without OVERWRITE_EXISTING.
        ResumeMismatchError: AUTO_RESUME found a checkpoint of another model.
    """
    ckpt = cfg.CHECKPOINT
    if has_final_checkpoint(folder):
        if not ckpt.OVERWRITE_EXISTING:
            recorded, diffs = run_differences(cfg, folder)
            if not diffs:
                return ResumeChoice(finished=True)
            raise finished_run_error(folder, recorded or {}, cfg, diffs)
        _moved(folder, f"{_KEY}.OVERWRITE_EXISTING=True")
        return ResumeChoice()
    if not ckpt.AUTO_RESUME:
        _moved(folder, f"{_KEY}.AUTO_RESUME=False (starting from scratch)")
        return ResumeChoice()
    choice = choose_resume_checkpoint(cfg, folder)
    if choice.checkpoint_path is None:
        if run_files(folder):
            _moved(folder, "no checkpoint to resume from (starting from scratch)")
        return choice
    check_resume_identity(cfg, folder, choice.checkpoint_path)
    return choice
