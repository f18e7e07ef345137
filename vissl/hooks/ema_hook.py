"""``EmaHook`` (``HOOKS.EMA_MODEL``): an exponential moving average of the model's weights.

On when ``SAVE_EMA_MODEL`` or ``ENABLE_EMA_METERS`` is set (as in VISSL).

- The EMA is a frozen copy of ``task.base_model`` (the plain model, not its DDP or
  ``torch.compile`` wrapper; see :mod:`vissl.models.momentum`), made once, before the first
  update, on the task's device (``EMA_DEVICE: gpu``) or the CPU (``EMA_DEVICE: cpu``). It
  starts from the model's weights after ``MODEL.WEIGHTS_INIT`` or a resume.
- ``on_update``: after every ``UPDATE_ITER``-th optimizer step (steps k, 2k, ...; with
  gradient accumulation a step is an optimizer step, not a micro-batch), each parameter
  becomes ``DECAY * ema + (1 - DECAY) * model``, in one foreach lerp on the device (no host
  read). Buffers (BatchNorm running statistics) are *copied* from the model rather than
  averaged: the model's statistics are estimates over recent batches already, the EMA
  never runs in train mode to collect its own, and averaging integer counters
  (``num_batches_tracked``) is meaningless. With ``EMA_DEVICE: cpu`` and the model on a
  GPU, an update starts one flat non-blocking copy of the weights per dtype into pinned
  host memory (:class:`~vissl.models.momentum.HostSnapshot`) and the average is taken on
  the CPU later, at the next update or when the EMA is read (a test phase, a
  checkpoint): the host never waits for the GPU.
  Under fp16 a step the GradScaler skips still counts (the model did not change, the
  EMA moves towards it), as in VISSL.
- Checkpoints hold the EMA as ``classy_state_dict["ema_model"]`` in the layout of
  ``base_model`` (``{"model": {"trunk", "heads", "other"}, "meta"}``), and a resume
  restores it, so the EMA of a resumed run equals the uninterrupted one. Evaluation tools
  load it with ``MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME: ema_model``.
- Under the FSDP task on several processes (``TRAINER.TASK_NAME:
  self_supervision_fsdp_task``) the EMA is sharded like the model: the task asks for the
  copy (:meth:`EmaHook.sharded_model_copies`) before sharding and gives it the model's
  units, so each rank holds 1/N of the average and an update is a local lerp of matching
  shards, with no gather. It is saved into the sharded (DCP) checkpoint under
  ``hook_entries.ema_model`` and restored (resharded) from it;
  ``extra_scripts/convert_sharded_checkpoint.py`` writes it as
  ``classy_state_dict["ema_model"]``. Its test-phase forward gathers unit by unit like the
  model's. ``EMA_DEVICE: cpu`` with the model on a GPU is refused there (a sharded copy
  lives on the mesh's device).
- ``ENABLE_EMA_METERS``: in TEST phases the EMA also runs on each batch (no gradients, in
  eval mode, under the run's autocast) and a second set of meters, built from
  ``config.METERS``, measures its outputs. During a test phase these meters sit in
  ``task.meters`` named ``ema_<meter name>`` (they ignore the train step's updates), so
  the trainer syncs them across ranks and ``metrics.json``, the log and TensorBoard show
  them beside the model's own, e.g. ``test_ema_accuracy_list_meter``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.meters.update import update_meters
from vissl.models.momentum import (
    EmaTensors,
    HostSnapshot,
    ema_tensors,
    ema_update_tensors_,
    momentum_copy,
    reset_momentum_copy_,
)
from vissl.utils.checkpoint import join_model_state, split_model_state

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

KEY = "config.HOOKS.EMA_MODEL"
#: ``EMA_DEVICE`` values: "gpu"/"cuda" mean the task's device (the CPU on a CPU run).
EMA_DEVICES = ("gpu", "cuda", "cpu")


def ema_enabled(ema_cfg: Mapping[str, Any]) -> bool:
    """Whether ``HOOKS.EMA_MODEL`` asks for the hook (either flag set)."""
    return bool(ema_cfg.get("SAVE_EMA_MODEL")) or bool(ema_cfg.get("ENABLE_EMA_METERS"))


def _check_decay(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(
            f"{KEY}.DECAY={value!r} must be a number in [0, 1] (the weight of the old average "
            "at each update; e.g. 0.9999).",
            f"{KEY}.DECAY",
        )
    return float(value)


def _check_update_iter(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{KEY}.UPDATE_ITER={value!r} must be a positive integer (update the average "
            "after every that many optimizer steps).",
            f"{KEY}.UPDATE_ITER",
        )
    return value


def _check_device(value: Any) -> str:
    name = value.lower() if isinstance(value, str) else value
    if name not in EMA_DEVICES:
        raise ConfigError(
            f"{KEY}.EMA_DEVICE={value!r} must be one of {list(EMA_DEVICES)}: 'gpu' keeps the "
            "average on the training device, 'cpu' in host memory.",
            f"{KEY}.EMA_DEVICE",
        )
    return "cpu" if name == "cpu" else "gpu"


class _EmaMeterView:
    """An EMA meter as it appears in ``task.meters`` during a test phase.

    The train step's ``update`` calls are ignored (the hook feeds the meter the EMA's
    outputs); reset, cross-rank sync, value and state are the meter's own; the name is
    ``ema_<name>``. ``supports_valid_mask`` spares the step a host sync for this meter.
    """

    supports_valid_mask = True

    def __init__(self, meter: Any) -> None:
        self.meter = meter

    @property
    def name(self) -> str:
        return f"ema_{self.meter.name}"

    @property
    def value(self) -> Any:
        return self.meter.value

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Ignored: the model's outputs are not the EMA's."""

    def reset(self) -> None:
        self.meter.reset()

    def sync_state(self) -> None:
        self.meter.sync_state()

    def state_dict(self) -> dict[str, Any]:
        state = getattr(self.meter, "state_dict", None)
        return dict(state()) if callable(state) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load = getattr(self.meter, "load_state_dict", None)
        if callable(load):
            load(state)


def _to_device(obj: Any, device: torch.device) -> Any:
    """Tensors (nested in lists/tuples/dicts) to ``device``; blocking, so safe to the host."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


class EmaHook(VisslHook):
    """Keeps an exponential moving average of ``task.base_model`` (see the module docstring).

    The EMA is saved in checkpoints whenever the hook is on: ``SAVE_EMA_MODEL`` alone asks
    for exactly that, and ``ENABLE_EMA_METERS`` needs it for a resumed run to continue the
    same average.

    Args:
        decay: weight of the old average at each update, in [0, 1].
        warmup: while ``task.where`` (the share of training done) is below it, an update
            copies the model instead of averaging (VISSL main's ``WARMUP``).
        update_iter: update after every that many optimizer steps (>= 1).
        ema_device: "gpu" (or "cuda": the task's device) or "cpu".
        enable_ema_meters: also measure the EMA with the METERS in test phases.
        meters_config: ``config.METERS`` (needed for ``enable_ema_meters``).
        stage_on_host: take the average from host snapshots, applied one update late
            (see the module docstring); None: when the EMA is on the CPU and the model
            on a GPU.

    Raises:
        ConfigError: a value out of range, or EMA meters without any meter configured.
    """

    # After hooks that change the weights once more after the optimizer step (SwAV's
    # prototype normalisation, Priority.LOW), so the average follows the final weights.
    priority = Priority.LOW + 5

    def __init__(
        self,
        decay: float = 0.9999,
        update_iter: int = 1,
        ema_device: str = "gpu",
        enable_ema_meters: bool = False,
        meters_config: Mapping[str, Any] | None = None,
        stage_on_host: bool | None = None,
        warmup: float = 0.0,
    ) -> None:
        self.decay = _check_decay(decay)
        if isinstance(warmup, bool) or not isinstance(warmup, int | float) or not 0 <= warmup <= 1:
            raise ConfigError(
                f"{KEY}.WARMUP={warmup!r} must be a number in [0, 1] (a share of training).",
                f"{KEY}.WARMUP",
            )
        self.warmup = float(warmup)
        self._pending_decay = self.decay
        self.stage_on_host = stage_on_host
        self._snapshot: HostSnapshot | None = None
        self._snapshot_pending = False
        self.update_iter = _check_update_iter(update_iter)
        self.ema_device = _check_device(ema_device)
        self.enable_ema_meters = bool(enable_ema_meters)
        self.meters_config = meters_config
        if self.enable_ema_meters:
            from vissl.meters.build import meter_names_from_config

            if not meter_names_from_config(meters_config):
                raise ConfigError(
                    f"{KEY}.ENABLE_EMA_METERS is on but config.METERS.names is empty: list the "
                    "meters to compute on the EMA model, or turn ENABLE_EMA_METERS off.",
                    f"{KEY}.ENABLE_EMA_METERS",
                )
        self.model: nn.Module | None = None
        self.device: torch.device | None = None
        self._tensors: EmaTensors | None = None
        # MODEL.COMPILE of a copy made before sharding: compiled at on_start, once sharded
        self._compile_pending = False
        self.ema_meters: list[Any] = []
        self._views: list[_EmaMeterView] = []

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> EmaHook:
        """Build from the ``config`` section (``HOOKS.EMA_MODEL`` and ``METERS``)."""
        ema = cfg["HOOKS"]["EMA_MODEL"]
        return cls(
            decay=ema.get("DECAY", 0.9999),
            update_iter=ema.get("UPDATE_ITER", 1),
            ema_device=ema.get("EMA_DEVICE", "gpu"),
            enable_ema_meters=bool(ema.get("ENABLE_EMA_METERS", False)),
            meters_config=cfg.get("METERS"),
            warmup=ema.get("WARMUP", 0.0),
        )

    # ------------------------------------------------------------------ the average
    def ensure_model(self, task: SelfSupervisionTask, to_be_sharded: bool = False) -> nn.Module:
        """The EMA model, copied from ``task.base_model`` on first use.

        Args:
            task: the task whose model the EMA follows.
            to_be_sharded: the FSDP task shards the copy next: ``MODEL.COMPILE`` waits
                for :meth:`on_start` and the tensors are paired at the first update
                (otherwise both happen now, the host buffers of an EMA on the CPU
                included).
        """
        if self.model is None:
            device = torch.device("cpu") if self.ema_device == "cpu" else task.device
            model = momentum_copy(task.base_model).to(device)
            model.eval()  # it never trains: dropout off, BatchNorm uses the copied stats
            self.model, self.device = model, device
            self._compile_pending = self.enable_ema_meters
            if not to_be_sharded:
                self._compile(task)
                self._paired(task)
            logger.info(
                "EMA of the model on %s: decay %s, updated every %d optimizer step(s)",
                device,
                self.decay,
                self.update_iter,
            )
        return self.model

    def _compile(self, task: SelfSupervisionTask) -> None:
        """``MODEL.COMPILE`` for the EMA's test-phase forwards (with EMA meters)."""
        compile_module = getattr(task, "compile_module", None)
        if self._compile_pending and self.model is not None and callable(compile_module):
            compile_module(self.model)
        self._compile_pending = False

    def _paired(self, task: SelfSupervisionTask) -> EmaTensors:
        """The EMA's tensors paired with the model's, gathered on first use (after the
        FSDP task sharded both: the pairs are then the two models' matching shards)."""
        if self._tensors is None:
            model = self.ensure_model(task)
            self._tensors = ema_tensors(model, task.base_model)
            assert self.device is not None
            stage = self.stage_on_host
            if stage is None:
                stage = self.device.type == "cpu" and task.device.type == "cuda"
            if stage:
                self._snapshot = HostSnapshot(
                    [*self._tensors.source_params, *self._tensors.source_buffers]
                )
        return self._tensors

    def sharded_model_copies(self, task: SelfSupervisionTask) -> list[nn.Module]:
        """The FSDP task (several processes) calls this before it shards the model: the
        EMA copy, made now from the unsharded model, for the task to shard with the
        model's units (after rank 0's weights are broadcast, the copy is reset to them).

        Raises:
            ConfigError: ``EMA_DEVICE: cpu`` while the model is on a GPU.
        """
        if self.ema_device == "cpu" and task.device.type != "cpu":
            raise ConfigError(
                f"{KEY}.EMA_DEVICE=cpu is not supported with TRAINER.TASK_NAME: "
                "self_supervision_fsdp_task on several processes: the EMA is sharded like the "
                f"model, on its device ({task.device.type}), and already holds only 1/N of "
                "the weights per process. Set EMA_DEVICE: gpu.",
                f"{KEY}.EMA_DEVICE",
            )
        if self.model is not None:
            raise RuntimeError("the EMA copy must be made for sharding, before anything else")
        return [self.ensure_model(task, to_be_sharded=True)]

    def on_start(self, task: SelfSupervisionTask) -> None:
        self.ensure_model(task)
        self._compile(task)
        if self.enable_ema_meters and not self.ema_meters:
            from vissl.meters import build_meters

            self.ema_meters = build_meters(self.meters_config, device=task.device)
            self._views = [_EmaMeterView(m) for m in self.ema_meters]

    def on_update(self, task: SelfSupervisionTask) -> None:
        # task.iteration counts the optimizer steps done before this one.
        if (task.iteration + 1) % self.update_iter != 0:
            return
        tensors = self._paired(task)
        # during WARMUP the EMA follows the model (a copy: momentum 0)
        decay = 0.0 if float(getattr(task, "where", 1.0)) < self.warmup else self.decay
        if self._snapshot is None:
            ema_update_tensors_(tensors, decay)
            return
        self.apply_pending()
        self._snapshot.launch()
        self._snapshot_pending = True
        self._pending_decay = decay

    @torch.no_grad()
    def apply_pending(self) -> None:
        """Fold in the update whose host snapshot is in flight (a no-op if none is)."""
        if not self._snapshot_pending:
            return
        assert self._snapshot is not None and self._tensors is not None
        ema_update_tensors_(self._tensors, self._pending_decay, source_values=self._snapshot.wait())
        self._snapshot_pending = False

    def on_end(self, task: SelfSupervisionTask) -> None:
        self.apply_pending()

    # ------------------------------------------------------------------ EMA meters
    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        if not self._views:
            return
        views = {id(v) for v in self._views}
        task.meters[:] = [m for m in task.meters if id(m) not in views]
        if not task.train:
            for meter in self.ema_meters:
                meter.reset()
            task.meters.extend(self._views)

    @torch.no_grad()
    def on_forward(self, task: SelfSupervisionTask) -> None:
        if task.train or not self.ema_meters:
            return
        model = self.ensure_model(task)
        self.apply_pending()
        assert self.device is not None
        sample = task.last_batch.sample
        x = sample["input"]
        if self.device != task.device:
            x = _to_device(x, self.device)
        with task.precision.autocast():
            output = model(x)
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        if self.device != task.device:
            output = _to_device(output, task.device)
        update_meters(self.ema_meters, output, sample["target"], sample.get("data_valid"))

    # ------------------------------------------------------------------ checkpoints
    def ema_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The EMA's flat state dict (``trunk.*``, ``heads.*``), or None before it exists."""
        self.apply_pending()
        return None if self.model is None else self.model.state_dict()

    def load_ema_state_dict(
        self, task: SelfSupervisionTask, state: Mapping[str, torch.Tensor]
    ) -> None:
        """Restore the EMA from a checkpoint (called on resume, before ``on_start``)."""
        self._snapshot_pending = False  # an update in flight is superseded
        self.ensure_model(task).load_state_dict(dict(state))

    def checkpoint_entries(self, task: SelfSupervisionTask) -> dict[str, Any]:
        """``{"ema_model": ...}`` for ``classy_state_dict``: VISSL's key, in the layout of
        ``base_model`` (``WEIGHTS_INIT.STATE_DICT_KEY_NAME: ema_model`` loads it).

        The EMA is made first if it does not exist yet: a sharded (DCP) checkpoint is
        loaded into these entries, which a resume asks for before :meth:`on_start`."""
        self.ensure_model(task)
        state = self.ema_state_dict()
        assert state is not None
        return {"ema_model": {"model": split_model_state(state), "meta": {}}}

    def restore_checkpoint_entries(
        self, task: SelfSupervisionTask, classy_state: Mapping[str, Any]
    ) -> None:
        """Restore the EMA saved by :meth:`checkpoint_entries` (or warn it is missing)."""
        if "ema_model" in classy_state:
            self.load_ema_state_dict(task, join_model_state(classy_state["ema_model"]["model"]))
        else:
            logger.warning(
                "the checkpoint holds no EMA model (classy_state_dict.ema_model): the "
                "HOOKS.EMA_MODEL average restarts from the restored weights."
            )
            if self.model is not None:  # made before the restore (sharded): follow it
                self._snapshot_pending = False
                reset_momentum_copy_(self.model, task.base_model)


__all__ = ["EMA_DEVICES", "EmaHook", "ema_enabled"]
