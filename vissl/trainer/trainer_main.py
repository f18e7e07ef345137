"""``SelfSupervisionTrainer``: builds the task and runs its phases.

The loop::

    step = get_train_step(TRAINER.TRAIN_STEP_NAME)
    on_start
    for each phase:
        advance phase (sampler epoch, data iterator, model.train/eval, epoch schedules)
        on_phase_start
        until the data iterator is exhausted:
            task = step(task); iteration += 1 (train); on_step
        meters synced across ranks; barrier; on_phase_end
    on_end
    (on any exception: on_exception, then re-raise)
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import TrainingPreempted
from vissl.hooks.base import HookDispatcher
from vissl.trainer.task import SelfSupervisionTask
from vissl.trainer.train_steps import get_train_step
from vissl.utils.checkpoint import load_resume_checkpoint
from vissl.utils.distributed import barrier, is_primary
from vissl.utils.preemption import PreemptionHandler
from vissl.utils.weights_init import init_model_from_weights_params_file

logger = logging.getLogger(__name__)


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
        self.task: SelfSupervisionTask | None = None

    def build_task(self) -> SelfSupervisionTask:
        task = SelfSupervisionTask(self.cfg, self.checkpoint_folder, self.device, self.hooks)
        task.build()
        # Losses and train steps may declare the hooks they need.
        extra = list(getattr(task.loss, "required_hooks", lambda: [])())
        if extra:
            task.hooks.extend(extra)
            task.dispatcher = HookDispatcher(task.hooks)
        if self.checkpoint_path:
            path, state = load_resume_checkpoint(self.checkpoint_path)
            logger.info("resuming from %s (iteration %d)", path, int(state["iteration"]))
            task.load_state_dict(state)
        elif self.cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
            init_model_from_weights_params_file(task.base_model, self.cfg.MODEL.WEIGHTS_INIT)
        return task

    def train(self) -> SelfSupervisionTask:
        # Look the step up first: a misspelt name fails before any data is read.
        step = get_train_step(self.cfg.TRAINER.TRAIN_STEP_NAME)
        task = self.build_task()
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
        preemption = PreemptionHandler()
        try:
            preemption.install()
            task.run_hooks("on_start")
            while task.phase_idx + 1 < len(task.phases):
                self._advance_phase(task)
                task.run_hooks("on_phase_start")
                while True:
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
                    if preemption.should_stop():
                        self._stop_for_preemption(task, preemption.signal_name)
                    if task.stop_training:
                        break
                if task.stop_training:
                    logger.info(
                        "training stopped at iteration %d: %s",
                        task.iteration,
                        task.stop_training_reason or "a hook asked to stop",
                    )
                    break
                for meter in task.meters:
                    meter.sync_state()
                barrier()
                task.run_hooks("on_phase_end")
            task.run_hooks("on_end")
        except TrainingPreempted:
            raise
        except BaseException:
            try:
                task.run_hooks("on_exception")
            except Exception:  # never hide the original error
                logger.exception("a hook failed in on_exception")
            raise
        finally:
            preemption.uninstall()
        return task

    def _stop_for_preemption(self, task: SelfSupervisionTask, signal_name: str) -> None:
        """Save an iteration checkpoint and raise :class:`TrainingPreempted`."""
        from vissl.hooks.checkpoint_hooks import save_task_checkpoint

        path = None
        if task.train:
            path = save_task_checkpoint(
                task,
                self.checkpoint_folder,
                f"model_iteration{task.iteration}.torch",
                phase_complete=False,
            )
        logger.warning(
            "%s received: stopped after iteration %d%s; exiting with code %d so the job can be "
            "requeued (AUTO_RESUME continues from the newest checkpoint).",
            signal_name,
            task.iteration,
            f", saved {path}" if path else " (test phase: resumes from the last checkpoint)",
            TrainingPreempted.exit_code,
        )
        raise TrainingPreempted(f"training stopped by {signal_name} at iteration {task.iteration}")

    def _advance_phase(self, task: SelfSupervisionTask) -> None:
        task.phase_idx += 1
        task.train = bool(task.phases[task.phase_idx]["train"])
        if task.train:
            task.train_phase_idx += 1
        split = "TRAIN" if task.train else "TEST"
        loader = task.dataloaders[split]
        set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(task.phase_idx)
        pending = task.pending_resume
        resuming = pending is not None
        if pending is not None and hasattr(loader.sampler, "set_start_iter"):
            batches_per_step = task.grad_accumulation_steps if task.train else 1
            loader.sampler.set_start_iter(pending["start_iter"] * batches_per_step)
        task.data_iterator = iter(loader)
        task.data_and_label_keys = {
            "input": list(self.cfg.DATA[split].INPUT_KEY_NAMES),
            "target": list(self.cfg.DATA[split].TARGET_KEY_NAMES),
        }
        task.model.train(task.train)
        task.local_iteration_num = 0
        task.reset_phase_loss()
        task.additional_log_data = {}
        for meter in task.meters:
            meter.reset()
        if resuming:
            task.restore_mid_phase()
            logger.info(
                "resumed inside phase %d after %d batches", task.phase_idx, task.local_iteration_num
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


def device_is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"
