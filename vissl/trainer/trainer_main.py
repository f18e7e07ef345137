"""``SelfSupervisionTrainer``: builds the task and runs its phases.

The loop::

    step = get_train_step(TRAINER.TRAIN_STEP_NAME)
    on_start
    for each phase:
        advance phase (sampler epoch, data iterator, model.train/eval, epoch schedules)
        on_phase_start
        until the data iterator is exhausted or every rank agreed to stop:
            task = step(task); iteration += 1 (train); on_step
        the next phase's data iterator started (with loader workers: its first batches
        are made while this phase ends); meters synced across ranks; barrier; on_phase_end
    task.end_reason = "finished" (or the stop's kind); on_end
    (on any exception: task.end_reason = "error", on_exception, then re-raise)

A stop (SIGTERM/SIGUSR1, Ctrl-C, or a hook calling ``task.request_stop`` / setting
``task.stop_training``) is agreed by every rank (:mod:`vissl.trainer.stopping`), then a
checkpoint is written (:mod:`vissl.trainer.checkpointing`) before training ends and
``on_end`` runs with ``task.end_reason`` set to the stop's kind ("requested",
"early_stop", "interrupted", "preempted"). After ``on_end`` a preemption raises
:class:`~vissl.errors.TrainingPreempted` (exit code 75: the job is requeued) and a
Ctrl-C :class:`~vissl.errors.TrainingInterrupted` (exit code 130). A second Ctrl-C
raises ``KeyboardInterrupt`` at once: ``on_exception`` runs with ``end_reason``
"interrupted", and no checkpoint is written.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

from vissl.config.attr_dict import AttrDict
from vissl.config.derive import derived_config
from vissl.errors import TrainingInterrupted, TrainingPreempted
from vissl.hooks.base import HookDispatcher
from vissl.trainer.checkpointing import (
    restore_mid_phase,
    restore_or_initialise,
    save_iteration_checkpoint,
    save_task_checkpoint,
)
from vissl.trainer.stopping import NO_STOP, StopController
from vissl.trainer.task import SelfSupervisionTask
from vissl.trainer.train_steps import get_train_step
from vissl.utils.distributed import barrier, is_primary
from vissl.utils.hydra_config import config_to_yaml
from vissl.utils.logger import start_log_file

logger = logging.getLogger(__name__)

#: The most steps between two stop agreements of the ranks, and the time aimed for
#: between two (see :mod:`vissl.trainer.stopping`): slow steps are checked every step.
STOP_CHECK_EVERY = 10
STOP_CHECK_SECONDS = 2.0


class SelfSupervisionTrainer:
    """Runs training (and test phases) for one process.

    Args:
        cfg: the validated ``config`` section.
        checkpoint_folder: output folder (checkpoints, logs).
        device: this process's device.
        hooks: hook objects, usually from ``default_hook_generator(cfg)``.
        checkpoint_path: a checkpoint to resume from, or None.
    """

    def __init__(
        self,
        cfg: AttrDict,
        checkpoint_folder: str,
        device: torch.device,
        hooks: list[Any],
        checkpoint_path: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.checkpoint_folder = checkpoint_folder
        self.device = device
        self.hooks = hooks
        self.checkpoint_path = checkpoint_path
        # train_config.yaml: the config the components are built from, with what the loss
        # infers from the rest of it (written by the config stage; derived here on a copy
        # for a config that did not go through it: deriving is idempotent)
        self._config_yaml = config_to_yaml(derived_config(cfg))
        # (phase index, data iterator) started ahead by _prefetch_next_phase
        self._prefetched: tuple[int, Any] | None = None
        self.task: SelfSupervisionTask | None = None

    def build_task(self, step: Any = None) -> SelfSupervisionTask:
        """Build the task, add the hooks its loss and ``step`` declare, then resume."""
        task = SelfSupervisionTask(self.cfg, self.checkpoint_folder, self.device, self.hooks)
        task.resume_checkpoint = self.checkpoint_path
        task.build()
        # Declared hooks join before the resume, so their checkpointed state is restored.
        owner = step.func if isinstance(step, functools.partial) else step
        self._add_required_hooks(task, owner)
        restore_or_initialise(task, self.checkpoint_path)
        self._commit_run_folder()
        return task

    def _commit_run_folder(self) -> None:
        """The run owns its folder from here (the resume fitted): rank 0 writes
        ``train_config.yaml`` and starts ``log.txt`` if its start was deferred."""
        if not is_primary():
            return
        start_log_file()
        path = os.path.join(self.checkpoint_folder, "train_config.yaml")
        os.makedirs(self.checkpoint_folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self._config_yaml)
        os.replace(tmp, path)

    @staticmethod
    def _add_required_hooks(task: SelfSupervisionTask, step: Any) -> None:
        """Hooks the loss and the train step declare through ``required_hooks()``."""
        extra: list[Any] = []
        for owner in (task.loss, step):
            required = getattr(owner, "required_hooks", None)
            if callable(required):
                extra.extend(h for h in required() if h is not None)
        if extra:
            task.hooks.extend(extra)
            task.dispatcher = HookDispatcher(task.hooks)

    def train(self) -> SelfSupervisionTask:
        # Look the step up first: a misspelt name fails before any data is read.
        step = get_train_step(self.cfg.TRAINER.TRAIN_STEP_NAME)
        task = self.build_task(step)
        task.train_step = step
        self.task = task
        if is_primary():
            logger.info(
                "train step %r; %s", self.cfg.TRAINER.TRAIN_STEP_NAME, task.dispatcher.describe()
            )
        clear_freq = (
            int(self.cfg.MODEL.CUDA_CACHE.CLEAR_FREQ)
            if self.cfg.MODEL.CUDA_CACHE.CLEAR_CUDA_CACHE and device_is_cuda(self.device)
            else 0
        )
        stopper = StopController(check_every=STOP_CHECK_EVERY, check_seconds=STOP_CHECK_SECONDS)
        stopped = False
        self._prefetched = None
        try:
            stopper.install()
            task.run_hooks("on_start")
            while task.phase_idx + 1 < len(task.phases):
                self._advance_phase(task)
                task.run_hooks("on_phase_start")
                agreed = NO_STOP
                while agreed == NO_STOP:
                    try:
                        result = step(task)
                    except StopIteration:
                        break
                    if result is None:
                        raise TypeError(
                            f"train step {self.cfg.TRAINER.TRAIN_STEP_NAME!r} returned None: a "
                            "train step must return the task it was given."
                        )
                    task = result
                    task.iteration += int(task.train)
                    task.local_iteration_num += 1
                    if clear_freq and task.iteration % clear_freq == 0:
                        torch.cuda.empty_cache()
                    task.run_hooks("on_step")
                    agreed = stopper.after_step(task)
                if agreed != NO_STOP:
                    self._stop(task, stopper, mid_phase=True)
                    stopped = True
                    break
                self._prefetch_next_phase(task)
                for meter in task.meters:
                    meter.sync_state()
                barrier()
                task.run_hooks("on_phase_end")
                # (a stop agreed at the end of the last phase changes nothing: it finished)
                last = task.phase_idx + 1 == len(task.phases)
                if stopper.at_phase_end(task) != NO_STOP and not last:
                    self._stop(task, stopper, mid_phase=False)
                    stopped = True
                    break
            task.end_reason = task.stop_kind if stopped else "finished"
            task.run_hooks("on_end")
            self._raise_for_exit_code(task, stopper)
        except (TrainingPreempted, TrainingInterrupted):
            raise
        except BaseException as err:
            # KeyboardInterrupt: a second Ctrl-C, or Ctrl-C outside the handled window
            task.end_reason = "interrupted" if isinstance(err, KeyboardInterrupt) else "error"
            try:
                task.run_hooks("on_exception")
            except Exception:  # never hide the original error
                logger.exception("a hook failed in on_exception")
            raise
        finally:
            stopper.uninstall()
            self._prefetched = None  # (a stop or an error: the iterator is not needed)
        return task

    def _stop(self, task: SelfSupervisionTask, stopper: StopController, mid_phase: bool) -> None:
        """Every rank agreed to stop: checkpoint and log; training then ends.

        Mid-phase in a train phase an iteration checkpoint is written; at the end of a
        train phase a phase checkpoint, unless the checkpoint hook just wrote one.
        """
        path = None
        if task.train and mid_phase:
            path = save_iteration_checkpoint(task)
        elif task.train and not task.checkpoints_written_this_phase:
            path = save_task_checkpoint(task, f"model_phase{task.phase_idx}.torch", True)
        where = f"iteration {task.iteration} (phase {task.phase_idx + 1}/{len(task.phases)})"
        saved = f"; saved {path}" if path else ""
        if task.stop_kind == "preempted":
            logger.warning(
                "%s received: stopped after %s%s; exiting with code %d so the job can be "
                "requeued (AUTO_RESUME continues from the newest checkpoint).",
                stopper.signal_name,
                where,
                saved,
                TrainingPreempted.exit_code,
            )
            return
        if task.stop_kind == "interrupted":
            resume = (
                "run the same command again to resume"
                if self.cfg.CHECKPOINT.AUTO_RESUME
                else "run the same command with config.CHECKPOINT.AUTO_RESUME=true to resume"
            )
            logger.warning(
                "%s: stopped after %s%s; exiting with code %d: %s.",
                task.stop_training_reason,
                where,
                saved,
                TrainingInterrupted.exit_code,
                resume,
            )
            return
        logger.info(
            "training stopped at %s: %s%s",
            where,
            task.stop_training_reason or "a hook asked to stop",
            saved,
        )

    def _raise_for_exit_code(self, task: SelfSupervisionTask, stopper: StopController) -> None:
        """After ``on_end``: a preemption or a Ctrl-C ends the process with its exit code."""
        if task.end_reason == "preempted":
            raise TrainingPreempted(
                f"training stopped by {stopper.signal_name} at iteration {task.iteration}"
            )
        if task.end_reason == "interrupted":
            raise TrainingInterrupted(
                f"training interrupted at iteration {task.iteration}: {task.stop_training_reason}",
                auto_resume=bool(self.cfg.CHECKPOINT.AUTO_RESUME),
            )

    def _advance_phase(self, task: SelfSupervisionTask) -> None:
        task.phase_idx += 1
        task.train = bool(task.phases[task.phase_idx]["train"])
        if task.train:
            task.train_phase_idx += 1
        split = "TRAIN" if task.train else "TEST"
        loader = task.dataloaders[split]
        pending = task.pending_resume
        resuming = pending is not None
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == task.phase_idx and not resuming:
            task.data_iterator = prefetched[1]  # started at the end of the last phase
        else:
            _set_epoch(loader, task.phase_idx)
            if pending is not None and hasattr(loader.sampler, "set_start_iter"):
                batches_per_step = task.grad_accumulation_steps if task.train else 1
                loader.sampler.set_start_iter(pending["start_iter"] * batches_per_step)
            task.data_iterator = iter(loader)
        task.data_and_label_keys = {
            "input": list(self.cfg.DATA[split].INPUT_KEY_NAMES),
            "target": list(self.cfg.DATA[split].TARGET_KEY_NAMES),
        }
        task.model.train(task.train)
        # Losses with state (DINO's center, queues) update it in training mode only.
        task.loss.train(task.train)
        task.local_iteration_num = 0
        task.phase_checkpoint_start = len(task.checkpoints_written)
        task.reset_phase_loss()
        task.additional_log_data = {}
        for meter in task.meters:
            meter.reset()
        if resuming:
            restore_mid_phase(task)
            logger.info(
                "resumed inside phase %d/%d after %d batches",
                task.phase_idx + 1,
                len(task.phases),
                task.local_iteration_num,
            )
        if task.train and task.param_schedulers is not None:
            task.param_schedulers.apply(task.optimizer, task.where, "epoch")
            task.param_schedulers.apply(task.optimizer, task.where, "step")
        if is_primary():
            logger.info(
                "phase %d/%d: %s (train phase %d/%d), %d steps",
                task.phase_idx + 1,
                len(task.phases),
                "train" if task.train else "test",
                task.train_phase_idx + 1,
                task.num_train_phases,
                task.steps_per_phase(split),
            )

    def _prefetch_next_phase(self, task: SelfSupervisionTask) -> None:
        """Start the next phase's data iterator as soon as this phase's data ends.

        Its loader workers then make the next phase's first batches while this phase
        ends (meter sync, checkpoint writes, the phase-end hooks) instead of after it.
        Only with loader workers (without, ``iter()`` does no work ahead); the order of
        the batches is the same as when the iterator starts in ``_advance_phase``: the
        sampler's epoch is the next phase's index either way.
        """
        nxt = task.phase_idx + 1
        if nxt >= len(task.phases) or task.stop_training:  # (a stop: no next phase)
            return
        split = "TRAIN" if task.phases[nxt]["train"] else "TEST"
        loader = task.dataloaders[split]
        if int(getattr(loader, "num_workers", 0) or 0) <= 0:
            return
        try:
            _set_epoch(loader, nxt)
            self._prefetched = (nxt, iter(loader))
        except Exception as err:  # e.g. workers that cannot start (out of memory, files)
            # Not here, before this phase's checkpoint: _advance_phase starts it again
            # after the phase end, where a failure no longer costs the phase's work.
            logger.warning(
                "could not start phase %d's data ahead (%s); starting it later", nxt, err
            )
            self._prefetched = None


def _set_epoch(loader: Any, epoch: int) -> None:
    set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def device_is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"
