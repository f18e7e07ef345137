"""``SelfSupervisionTask``: the state a train step and the hooks work on.

Attribute names follow VISSL's task, since custom steps and hooks read them: ``model``,
``base_model``, ``loss``, ``optimizer``, ``meters``, ``data_iterator``, ``train``,
``where``, ``iteration``, ``local_iteration_num``, ``phase_idx``, ``train_phase_idx``,
``max_iteration``, ``num_updates``, ``last_batch``, ``perf_stats``, ``amp_type``,
``amp_grad_scaler``, ``enable_manual_gradient_reduction``, ``additional_log_data``,
``config``, ``checkpoint_folder``, ``device``, ``run_hooks(name)``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.hooks.base import HookDispatcher
from vissl.models.momentum import momentum_copies
from vissl.optimizers.zero import SDP_TASK_NAME, is_sdp_task, sharded_ddp_notes
from vissl.trainer.checkpointing import (
    checkpoint_state,
    restore_checkpoint_state,
    save_task_checkpoint,
)
from vissl.trainer.fsdp import FSDP_TASK_NAME, FSDPReduction, is_fsdp_task, shard_task_model
from vissl.trainer.gradient_reduction import NoReduction, build_gradient_reducer_from_config
from vissl.trainer.precision import Precision, build_precision
from vissl.utils.distributed import broadcast_coalesced, get_rank, get_world_size
from vissl.utils.perf_stats import PerfStats
from vissl.utils.sync_bn import convert_sync_batchnorm

logger = logging.getLogger(__name__)

#: ``request_stop`` kinds, least urgent first (a more urgent request overrides the kind).
STOP_KINDS = ("requested", "early_stop", "interrupted", "preempted")
#: ``end_reason`` values: how training ended.
END_REASONS = ("finished", *STOP_KINDS, "error")


def build_phases(config: AttrDict) -> list[dict[str, bool]]:
    """Train phases from OPTIMIZER.num_epochs, with test phases per TEST_EVERY_NUM_EPOCH."""
    num_epochs = int(config.OPTIMIZER.num_epochs)
    if config.TEST_ONLY:
        return [{"train": False}]
    phases: list[dict[str, bool]] = []
    every = max(1, int(config.TEST_EVERY_NUM_EPOCH))
    for epoch in range(num_epochs):
        phases.append({"train": True})
        if config.TEST_MODEL and ((epoch + 1) % every == 0 or epoch == num_epochs - 1):
            phases.append({"train": False})
    return phases


class SelfSupervisionTask:
    """Everything one training run needs, built once from the config.

    Args:
        config: the validated ``config`` section (an :class:`AttrDict`).
        checkpoint_folder: where checkpoints and logs are written.
        device: the device this process trains on.
        hooks: hook objects (see :mod:`vissl.hooks`).
    """

    def __init__(
        self,
        config: AttrDict,
        checkpoint_folder: str,
        device: torch.device,
        hooks: Iterable[Any] = (),
    ) -> None:
        self.config = config
        self.checkpoint_folder = checkpoint_folder
        self.device = device
        self.hooks: list[Any] = list(hooks)
        self.dispatcher = HookDispatcher(self.hooks)

        self.phases = build_phases(config)
        self.num_train_phases = sum(p["train"] for p in self.phases)
        self.phase_idx = -1
        self.train_phase_idx = -1
        self.iteration = 0
        self.local_iteration_num = -1
        self.num_updates = 0
        self.train = True
        self.max_iteration = 0

        self.model: nn.Module = nn.Identity()
        self.base_model: nn.Module = nn.Identity()
        self.loss: nn.Module = nn.Identity()
        self.optimizer: Any = None
        self.param_schedulers: Any = None
        self.meters: list[Any] = []
        self.datasets: dict[str, Any] = {}
        self.dataloaders: dict[str, Any] = {}
        self.data_iterator: Iterator[Any] = iter(())
        self.precision: Precision = Precision()
        self.grad_reducer: NoReduction = NoReduction()
        # Shared between hooks: declared here, set by the hook named.
        self.perf_stats: PerfStats | None = None  # LogPerfTimeMetricsHook (None: timers off)
        self.tensorboard_writer: Any = None  # SSLTensorboardHook, on the primary rank
        self.checkpoints_written: list[str] = []  # every checkpoint this run wrote
        self.phase_checkpoint_start = 0  # len(checkpoints_written) when the phase began
        self.last_batch: Any = None
        self.additional_log_data: dict[str, Any] = {}
        self.checkpoint: dict[str, Any] | None = None
        self.data_and_label_keys = {
            "input": list(config.DATA.TRAIN.INPUT_KEY_NAMES),
            "target": list(config.DATA.TRAIN.TARGET_KEY_NAMES),
        }
        self.enable_training_meter = bool(config.METERS.get("enable_training_meter", True))
        self.enable_manual_gradient_reduction = bool(config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION)
        self.grad_accumulation_steps = int(config.OPTIMIZER.GRAD_ACCUMULATION_STEPS)
        # Read every step (by several hooks): looked up in the (read-only) config once.
        self._log_frequency = max(1, int(config.LOG_FREQUENCY))
        self._global_batchsize: dict[bool, int] = {}  # train -> samples per step
        self._world_size: int | None = None
        self.micro_step = 0
        #: split -> the colour transforms run batched on the device (TRANSFORMS_ON_DEVICE)
        self.device_transforms: dict[str, Any] = {}
        # a hook may set these (or call request_stop) to end training after the current step
        self.stop_training = False
        self.stop_training_reason = ""
        #: The train step object the trainer calls (set by the trainer; hooks may read it,
        #: e.g. for its ``dump_hparams()``).
        self.train_step: Any = None
        #: why a stop was asked for: one of STOP_KINDS ("requested" when a hook only set
        #: ``stop_training``); the trainer turns it into ``end_reason``
        self.stop_kind = ""
        #: how training ended, set by the trainer before ``on_end`` ("finished",
        #: "early_stop", "preempted", "interrupted", "requested") or ``on_exception``
        #: ("error"); empty while training runs
        self.end_reason = ""
        self.channels_last = bool(config.MODEL.CHANNELS_LAST)
        self._phase_loss_sum: torch.Tensor | None = None
        # steps without a loss_weight (weight 1 each); a float after a weighted resume
        self._phase_loss_count: float = 0
        self._phase_loss_weight: torch.Tensor | None = None  # total loss_weight, on the device
        self.pending_resume: dict[str, Any] | None = None
        #: TRAINER.TASK_NAME: self_supervision_fsdp_task: checkpoints are sharded (DCP),
        #: and with several processes the model is sharded with FSDP2 (vissl.trainer.fsdp)
        self.sharded_checkpoints = is_fsdp_task(config)
        #: the checkpoint the trainer resumes from (set before build; None: none)
        self.resume_checkpoint: str | None = None
        #: MODEL.WEIGHTS_INIT was applied while building (before sharding the model)
        self.weights_initialised = False

    # ------------------------------------------------------------------ building
    @property
    def available_splits(self) -> list[str]:
        splits = []
        if any(p["train"] for p in self.phases):
            splits.append("TRAIN")
        if any(not p["train"] for p in self.phases):
            splits.append("TEST")
        return splits

    def build(self) -> SelfSupervisionTask:
        """Build data, model, loss, meters, optimizer, schedules, precision and reducer."""
        from vissl.data import build_dataset, get_loader
        from vissl.losses import build_loss
        from vissl.meters import build_meters
        from vissl.models import build_model
        from vissl.optimizers import build_optimizer
        from vissl.optimizers.param_scheduler import build_param_schedulers

        cfg = self.config
        world_size = get_world_size()
        for split in self.available_splits:
            if not cfg.DATA[split].DATA_SOURCES and not cfg.DATA[split].DATASET_NAMES:
                hint = (
                    " or set config.TEST_MODEL=False to train without test phases"
                    if split == "TEST"
                    else ""
                )
                raise ConfigError(
                    f"config.DATA.{split}.DATA_SOURCES is empty but the run has "
                    f"{split.lower()} phases: list a data source (e.g. [synthetic], "
                    f"[digits], [disk_folder]){hint}.",
                    f"config.DATA.{split}.DATA_SOURCES",
                )
            self.datasets[split] = build_dataset(cfg, split)
            if split == "TRAIN" and bool(cfg.DATA.TRAIN.get("TRANSFORMS_ON_DEVICE", False)):
                # before the loader: its workers get the shortened chain
                self.device_transforms[split] = self.datasets[split].move_transforms_to_device()
            self.dataloaders[split] = get_loader(
                self.datasets[split],
                cfg,
                split,
                num_replicas=world_size,
                rank=get_rank(),
                seed=int(cfg.SEED_VALUE),
                device_is_cuda=self.device.type == "cuda",
            )
        if "TRAIN" in self.dataloaders:
            steps_per_phase = self.steps_per_phase("TRAIN")
            if steps_per_phase == 0:
                raise ConfigError(
                    "the training data loader yields no optimizer step: the data set has fewer "
                    "samples per process than config.DATA.TRAIN.BATCHSIZE_PER_REPLICA (times "
                    "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS). Lower the batch size or use more "
                    "data (config.DATA.TRAIN.DATA_LIMIT).",
                    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA",
                )
            self.max_iteration = self.num_train_phases * steps_per_phase

        model = build_model(cfg.MODEL, cfg.OPTIMIZER)
        model = convert_sync_batchnorm(model, cfg, self.device)
        self.base_model = model.to(self.device)
        if self.channels_last:
            self.base_model = self.base_model.to(memory_format=torch.channels_last)
        self.loss = build_loss(self._loss_config_with_data_size(), cfg).to(self.device)
        bind_model = getattr(self.loss, "bind_model", None)
        if callable(bind_model):
            # A loss that keeps a copy of the model (momentum encoder, teacher) makes it
            # here, before its state is broadcast and before a checkpoint is restored.
            bind_model(self.base_model)
        # Prototypes, queues, centers and teachers start equal on every rank, although
        # each rank seeds with SEED_VALUE + rank (DDP does the same for the model).
        loss_state = [*self.loss.parameters(), *self.loss.buffers()]
        if world_size > 1 and loss_state:
            broadcast_coalesced([t.data for t in loss_state], src=0)
        fsdp = is_fsdp_task(cfg) and world_size > 1
        if is_sdp_task(cfg):
            logger.info(
                "%s (fairscale's ShardedDDP + OSS): DDP with the optimizer state sharded "
                "(ZeroRedundancyOptimizer, as OPTIMIZER.use_zero)",
                SDP_TASK_NAME,
            )
        for note in sharded_ddp_notes(cfg.MODEL.get("SHARDED_DDP_SETUP")):
            logger.info(note)
        if fsdp:
            self._shard_model()
        elif is_fsdp_task(cfg):
            logger.info("%s with one process: the model is not sharded", FSDP_TASK_NAME)
        self.meters = build_meters(cfg.METERS, device=self.device)
        if "TRAIN" in self.available_splits:
            self.param_schedulers = build_param_schedulers(
                cfg.OPTIMIZER,
                batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
                * self.grad_accumulation_steps,
                world_size=world_size,
                num_nodes=int(cfg.DISTRIBUTED.NUM_NODES),
            )
            self.optimizer = build_optimizer(
                cfg.OPTIMIZER,
                self.base_model,
                param_schedulers=self.param_schedulers,
                model_config=cfg.MODEL,
            )
            if bool(cfg.OPTIMIZER.get("use_zero", False)) or is_sdp_task(cfg):
                self.optimizer = self._zero_optimizer(self.optimizer, world_size, fsdp)
        self.precision = build_precision(cfg.MODEL.AMP_PARAMS, self.device)
        if fsdp:
            self.grad_reducer = FSDPReduction(bool(cfg.DISTRIBUTED.BROADCAST_BUFFERS))
        else:
            self.grad_reducer = build_gradient_reducer_from_config(cfg, world_size)
        self.model = self.grad_reducer.wrap(self.base_model, self.device)
        compile_cfg = cfg.MODEL.COMPILE
        if compile_cfg.USE_COMPILE:
            # base_model stays the plain module: checkpoints and hooks read it.
            backend = str(compile_cfg.BACKEND)
            mode = str(compile_cfg.MODE) if backend == "inductor" else None
            self.model = torch.compile(self.model, backend=backend, mode=mode)  # type: ignore[assignment]
            # The loss's copies of the model (teacher, key encoder) run forwards too.
            for copy in momentum_copies(self.loss):
                self.compile_module(copy)
        logger.info(
            "task built: %d phases (%d train), %d iterations, precision %s, gradient reduction %s",
            len(self.phases),
            self.num_train_phases,
            self.max_iteration,
            self.precision.name,
            self.grad_reducer.name,
        )
        return self

    def _shard_model(self) -> None:
        """Shard the model and the loss's momentum copies with FSDP2 (collective), before
        the optimizer is built on the sharded parameters. ``MODEL.WEIGHTS_INIT`` is applied
        first when the run does not resume (it loads full tensors)."""
        cfg = self.config
        if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE and not self.resume_checkpoint:
            from vissl.trainer.checkpointing import reset_momentum_copies
            from vissl.utils.weights_init import init_model_from_weights_params_file

            init_model_from_weights_params_file(self.base_model, cfg.MODEL.WEIGHTS_INIT)
            reset_momentum_copies(self)
            self.weights_initialised = True
        # copies of the model a hook keeps (EmaHook's average), made now from the full
        # model and sharded with it
        followers = [
            copy
            for hook in self.hooks
            if callable(getattr(hook, "sharded_model_copies", None))
            for copy in hook.sharded_model_copies(self)
        ]
        shard_task_model(
            self.base_model,
            momentum_copies(self.loss),
            cfg.MODEL.FSDP_CONFIG,
            self.device,
            followers=followers,
        )

    @staticmethod
    def _zero_optimizer(optimizer: Any, world_size: int, fsdp: bool) -> Any:
        """``OPTIMIZER.use_zero``: the optimizer state sharded over the ranks (DDP runs)."""
        if fsdp:
            logger.info("OPTIMIZER.use_zero: FSDP already shards the optimizer state")
            return optimizer
        if world_size == 1:
            logger.info("OPTIMIZER.use_zero: one process, nothing to shard")
            return optimizer
        from vissl.optimizers.zero import wrap_zero

        return wrap_zero(optimizer)

    def _loss_config_with_data_size(self) -> Mapping[str, Any]:
        """``config.LOSS``, with ``LOSS.<name>.num_train_samples``, where the loss has that
        key (memory banks: ``nce_loss_with_memory``, ``deepclusterv2_loss``), set to the
        size of the data set the run iterates (TRAIN, else TEST), as VISSL sets it. A copy:
        the config itself is not changed (it stays what was validated and saved)."""
        loss_config = self.config.LOSS
        name = loss_config.get("name")
        params = loss_config.get(name) if isinstance(name, str) else None
        if not isinstance(params, Mapping) or "num_train_samples" not in params:
            return loss_config
        split = "TRAIN" if "TRAIN" in self.datasets else "TEST"
        if split not in self.datasets:
            return loss_config
        size = len(self.datasets[split])
        given = params["num_train_samples"]
        if isinstance(given, int) and given > 0 and given != size:
            logger.warning(
                "config.LOSS.%s.num_train_samples is %d but the %s data set has %d samples: "
                "using %d (the memory holds one entry per sample).",
                name,
                given,
                split,
                size,
                size,
            )
        block = AttrDict({**copy.deepcopy(dict(params)), "num_train_samples": size})
        return AttrDict({**dict(loss_config), name: block})

    def compile_module(self, module: nn.Module) -> nn.Module:
        """``MODEL.COMPILE`` applied to another module the run calls (a teacher, a key
        encoder, the EMA model): compiled in place (``nn.Module.compile``), so its
        state-dict keys, and so the checkpoints, do not change. A no-op when compile is
        off."""
        compile_cfg = self.config.MODEL.COMPILE
        if compile_cfg.USE_COMPILE:
            backend = str(compile_cfg.BACKEND)
            mode = str(compile_cfg.MODE) if backend == "inductor" else None
            module.compile(backend=backend, mode=mode)
        return module

    # ------------------------------------------------------------------ VISSL names
    @property
    def amp_type(self) -> str | None:
        return self.precision.amp_type

    @property
    def amp_grad_scaler(self) -> Any:
        return self.precision.grad_scaler

    @property
    def where(self) -> float:
        """Fraction of training done, in [0, 1]; schedules are evaluated at this value."""
        if self.max_iteration <= 0:
            return 0.0
        return self.iteration / self.max_iteration

    @property
    def world_size(self) -> int:
        """Number of training processes (read once: it is fixed while the task trains)."""
        if self._world_size is None:
            self._world_size = get_world_size()
        return self._world_size

    @property
    def is_log_iteration(self) -> bool:
        """Whether the step just completed is one to log (every LOG_FREQUENCY, and the 1st).

        Counted in optimizer steps in train phases, in batches of the phase in test phases
        (the trainer has already counted the step when ``on_step`` runs).
        """
        n = self.iteration if self.train else self.local_iteration_num
        return n == 1 or n % self._log_frequency == 0

    @property
    def checkpoints_written_this_phase(self) -> list[str]:
        """Checkpoints written since the current phase started."""
        return self.checkpoints_written[self.phase_checkpoint_start :]

    def get_global_batchsize(self) -> int:
        """Samples per optimizer step over all ranks (times the accumulation steps)."""
        cached = self._global_batchsize.get(self.train)
        if cached is not None:
            return cached
        split = "TRAIN" if self.train else "TEST"
        accumulation = self.grad_accumulation_steps if self.train else 1
        size = int(self.config.DATA[split].BATCHSIZE_PER_REPLICA) * self.world_size * accumulation
        # the config is read-only and the world size fixed while the task trains
        self._global_batchsize[self.train] = size
        return size

    def steps_per_phase(self, split: str) -> int:
        """Optimizer steps (train) or batches (test) in one phase of ``split``: the whole
        phase, also while a resumed phase's sampler still has batches to skip."""
        loader = self.dataloaders[split]
        # len() leaves out the batches a mid-phase resume skips until the sampler is first
        # iterated (at once with loader workers, at the first batch without): add them back
        skipped = getattr(getattr(loader, "sampler", None), "start_iter", 0)
        batches = len(loader) + (skipped if isinstance(skipped, int) else 0)
        return batches // self.grad_accumulation_steps if split == "TRAIN" else batches

    def run_hooks(self, event: str) -> None:
        self.dispatcher.run(event, self)

    def request_stop(self, reason: str, kind: str = "requested") -> None:
        """Ask training to stop after the current step, as setting ``stop_training`` does.

        Every rank agrees on the stop, an iteration checkpoint is written (a phase
        checkpoint at a phase end), ``end_reason`` is set to ``kind`` and ``on_end`` runs.
        Safe to call from a hook or a signal handler; the first request's reason is kept.

        Args:
            reason: a human-readable reason, logged and kept in ``stop_training_reason``.
            kind: one of ``STOP_KINDS``: "requested", "early_stop", "interrupted" or
                "preempted" ("preempted" exits with code 75 so the job is requeued).

        Raises:
            ValueError: ``kind`` is not one of ``STOP_KINDS``.
        """
        if kind not in STOP_KINDS:
            raise ValueError(f"request_stop: unknown kind {kind!r}; expected one of {STOP_KINDS}")
        if not self.stop_training_reason:
            self.stop_training_reason = reason
        # the more urgent kind wins (a Ctrl-C after an early stop still reads "interrupted")
        if STOP_KINDS.index(kind) >= STOP_KINDS.index(self.stop_kind or "requested"):
            self.stop_kind = kind
        self.stop_training = True

    # ------------------------------------------------------------------ phase losses
    def reset_phase_loss(self) -> None:
        self._phase_loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self._phase_loss_count = 0
        self._phase_loss_weight = None

    def accumulate_loss(self, loss: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """Add a step's (detached, rank-reduced) loss to this phase's running sum, on the device.

        Args:
            loss: the step's loss; with ``weight``, its weighted mean over micro-batches
                and ranks.
            weight: the step's total ``loss_weight`` (a device tensor), or None: the step
                counts with weight 1. The phase average is ``sum(loss * weight) /
                sum(weight)``.
        """
        if self._phase_loss_sum is None:
            self.reset_phase_loss()
        assert self._phase_loss_sum is not None
        if weight is None:
            self._phase_loss_sum.add_(loss.float())
            self._phase_loss_count += 1
            return
        weight = weight.detach().float()
        self._phase_loss_sum.add_(loss.float() * weight)
        if self._phase_loss_weight is None:
            self._phase_loss_weight = weight.clone()
        else:
            self._phase_loss_weight.add_(weight)

    def _phase_loss_totals(self) -> tuple[float, float]:
        """``(sum, total weight)`` of the phase so far (reads the device once)."""
        if self._phase_loss_sum is None:
            return 0.0, self._phase_loss_count
        if self._phase_loss_weight is None:
            return float(self._phase_loss_sum.item()), self._phase_loss_count
        total, weight = torch.stack([self._phase_loss_sum, self._phase_loss_weight]).tolist()
        return total, self._phase_loss_count + weight

    def phase_average_loss(self) -> float:
        """(Weighted) mean loss of the phase so far (reads the device once)."""
        if self._phase_loss_sum is None:
            return float("nan")
        total, count = self._phase_loss_totals()
        if count == 0:
            return float("nan")
        return total / count

    # ------------------------------------------------------------------ state
    def phase_loss_state(self) -> tuple[float, float]:
        """``(sum, count)`` of this phase's losses so far (reads the device once).

        ``count`` is the number of steps (an int) when no step had a ``loss_weight``, else
        the total weight (a float; steps without one count 1).
        """
        return self._phase_loss_totals()

    def set_phase_loss(self, total: float, count: float) -> None:
        """Restore this phase's running loss (mid-phase resume)."""
        self.reset_phase_loss()
        assert self._phase_loss_sum is not None
        self._phase_loss_sum.fill_(total)
        self._phase_loss_count = count

    def save_checkpoint(
        self, filename: str, phase_complete: bool = True, keep_last: int = -1
    ) -> str | None:
        """See :func:`vissl.trainer.checkpointing.save_task_checkpoint` (collective)."""
        return save_task_checkpoint(self, filename, phase_complete, keep_last)

    def state_dict(self, phase_complete: bool = True) -> dict[str, Any]:
        """See :func:`vissl.trainer.checkpointing.checkpoint_state` (collective)."""
        return checkpoint_state(self, phase_complete)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :func:`vissl.trainer.checkpointing.restore_checkpoint_state`."""
        restore_checkpoint_state(self, state)
