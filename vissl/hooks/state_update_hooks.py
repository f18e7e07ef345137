"""Hooks that guard or modify training state: NaN/Inf loss check, gradient clipping
(:class:`~vissl.hooks.grad_clip_hooks.GradClipHook`, re-exported here), parameters frozen
for the first iterations (``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP``)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.grad_clip_hooks import GradClipHook  # noqa: F401  (its former home)
from vissl.hooks.log_values import read_log_values
from vissl.utils.checkpoint import detach_to_cpu

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


def _sums(output: Any) -> list[torch.Tensor] | None:
    """One float32 0-d sum per tensor in ``output`` (no host read); None when a tensor is
    not a dense real one (its finiteness is then checked element-wise)."""
    if isinstance(output, torch.Tensor):
        if output.layout != torch.strided or output.is_complex():
            return None
        return [output.sum(dtype=torch.float32)]  # (called under no_grad)
    sums: list[torch.Tensor] = []
    if isinstance(output, list | tuple):
        for item in output:
            part = _sums(item)
            if part is None:
                return None
            sums.extend(part)
    return sums


def _all_finite(output: Any) -> torch.Tensor | None:
    """A 0-d bool tensor: whether every tensor in ``output`` is finite (no host read)."""
    if isinstance(output, torch.Tensor):
        return torch.isfinite(output.detach()).all()
    if isinstance(output, list | tuple) and output:
        flags = [f for f in (_all_finite(o) for o in output) if f is not None]
        return torch.stack(flags).all() if flags else None
    return None


class CheckNanLossHook(VisslHook):
    """Raise ``FloatingPointError`` naming the iteration when the loss or the model output
    is NaN or Inf, after dumping this rank's input and output as VISSL did
    (``rank{r}_input_sample.pth``, ``rank{r}_model_output.pth`` in the checkpoint folder).

    No device work per step: each step's loss (already detached by the train step) is
    kept by reference; every LOG_FREQUENCY iterations and at phase end one number is read
    back, the sum of the kept losses and of the last model output (a sum is finite when
    all its terms are), before any checkpoint is written (this hook runs first at phase
    end, and checkpoints refuse non-finite weights anyway). Only when it is not finite are
    the values checked one by one, to name the first bad iteration. A non-finite model
    output almost always makes the loss non-finite; the output itself is checked on the
    batches of those reads.
    """

    priority = Priority.HIGHEST

    def __init__(self, window: int = 10, dump_folder: str | None = None) -> None:
        self.window = max(1, int(window))
        self.dump_folder = dump_folder
        self._losses: list[torch.Tensor] = []
        self._iters: list[int] = []
        self._phases: list[int] = []

    def on_step(self, task: SelfSupervisionTask) -> None:
        loss = task.last_batch.loss if task.last_batch is not None else None
        if loss is not None:
            self._losses.append(loss)
            self._iters.append(task.iteration if task.train else task.local_iteration_num)
            self._phases.append(task.phase_idx)
        if task.is_log_iteration or len(self._iters) >= self.window:
            self.check(task)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        self.check(task)

    def before_save(self, task: SelfSupervisionTask) -> None:
        """A pending check names the iteration where things went wrong: run it before a save."""
        self.check(task)

    def _dump(self, task: SelfSupervisionTask) -> str:
        if not self.dump_folder or task.last_batch is None:
            return ""
        from vissl.utils.distributed import get_rank

        rank = get_rank()
        os.makedirs(self.dump_folder, exist_ok=True)
        out = os.path.join(self.dump_folder, f"rank{rank}_model_output.pth")
        inp = os.path.join(self.dump_folder, f"rank{rank}_input_sample.pth")
        torch.save(detach_to_cpu(task.last_batch.model_output), out)
        torch.save(detach_to_cpu(task.last_batch.sample.get("input")), inp)
        return f" The last batch's input and output are in {inp} and {out}."

    def check(self, task: SelfSupervisionTask) -> None:
        """Read the kept losses (one device read); raise on the first non-finite one."""
        n = len(self._iters)
        if n == 0:
            return
        last = task.last_batch
        with torch.no_grad():  # the losses are detached already; no per-loss ops
            losses = self._losses
            if not all(t.dim() == 0 and t.dtype == torch.float32 for t in losses):
                losses = [t.float().reshape(()) for t in losses]
            # Fast path, three ops and one read: a sum is finite when every term is (a
            # sum of finite terms that overflows only sends us to the check below).
            out_sums = _sums(last.model_output) if last is not None else []
            if out_sums is not None:
                total = torch.stack([*losses, *out_sums]).sum()
                if last is not None and self._losses[-1] is last.loss:
                    # the same read brings the log values (loss, loss.<k>) to the host
                    # for the log hooks of this step
                    total_value = read_log_values(task, total)[1][0]
                else:
                    total_value = total.item()
                if math.isfinite(total_value):
                    self._clear()
                    return
            values = torch.stack(losses)
            flags = torch.isfinite(values)
            out_ok = _all_finite(last.model_output) if last is not None else None
            if out_ok is not None:
                flags = torch.cat([flags, out_ok.reshape(1)])
        finite = flags.tolist()
        bad = [i for i in range(n) if not finite[i]]
        if not bad and out_ok is not None and not finite[n]:
            bad = [n - 1]  # the last batch's output is non-finite, its loss is not
        if bad:
            first = bad[0]
            value = float(values[first].item())
            iteration, phase = self._iters[first], self._phases[first]
            kind = "train" if task.train else "test"
            what = (
                f"non-finite loss {value}"
                if not finite[first]
                else f"non-finite model output (loss {value})"
            )
            dumped = self._dump(task)
            raise FloatingPointError(
                f"{what} at {kind} iteration {iteration} (phase {phase}).{dumped} Lower the "
                "learning rate (config.OPTIMIZER.param_schedulers.lr), check the data, or set "
                "config.HOOKS.CHECK_NAN=False to train on anyway."
            )
        self._clear()

    def _clear(self) -> None:
        self._losses.clear()
        self._iters.clear()
        self._phases.clear()


_FROZEN_KEY = "config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"


def parse_frozen_params_map(entries: Sequence[Any]) -> dict[str, int]:
    """``[[param_name, num_iters], ...]`` as ``{name: num_iters}``.

    VISSL's names carry DDP's ``module.`` prefix (``module.heads.0.prototypes0.weight``)
    and, in its FSDP configs, FSDP's wrapper levels (``_fsdp_wrapped_module.``,
    ``_fpw_module.``); both are accepted and removed (logged), so VISSL's SwAV configs,
    which list both spellings of one parameter, name it once.

    Raises:
        ConfigError: an entry that is not ``[name, non-negative int]``, or two spellings
            of one parameter with different counts.
    """
    from vissl.utils.vissl_key_maps import config_parameter_name

    result: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, Sequence)
            or isinstance(entry, str)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
            or entry[1] < 0
        ):
            raise ConfigError(
                f"{_FROZEN_KEY}[{i}]={entry!r}: each entry must be [parameter name, number of "
                "iterations >= 0], e.g. ['heads.0.prototypes0.weight', 313].",
                f"{_FROZEN_KEY}[{i}]",
            )
        name = config_parameter_name(entry[0], f"{_FROZEN_KEY}[{i}]")
        if name in result and result[name] != int(entry[1]):
            raise ConfigError(
                f"{_FROZEN_KEY}[{i}]={entry!r} names {name!r} again, with {entry[1]} "
                f"iterations instead of {result[name]}; keep one entry per parameter.",
                f"{_FROZEN_KEY}[{i}]",
            )
        result[name] = int(entry[1])
    return result


def resolve_parameter_name(
    name: str, model: torch.nn.Module, named: Mapping[str, Any]
) -> str | None:
    """The name in ``named`` (the model's parameters) of the parameter ``name`` stands for.

    ``name`` may reach a parameter through a module attribute that is not registered
    (``ibot_head``'s ``prototypes1`` is ``prototypes0`` when the head is shared), and may
    use VISSL's ``torch.nn.utils.weight_norm`` names: ``<layer>.weight_v`` for the
    direction and ``<layer>.weight_g`` for the row norms of a weight-normalised last layer
    (DINO's, iBOT's heads); ours are ``<layer>.weight`` and, when learnable
    (``normalize_last_layer: False``), ``<layer>.scale``.

    Returns:
        ``name`` itself when it is a parameter's name; ``""`` for a ``weight_g`` whose norm
        is fixed (no parameter to freeze); None when nothing matches.
    """
    if name in named:
        return name
    layer, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(layer) if layer else model
    except AttributeError:
        return None
    ours = {"weight_v": "weight", "weight_g": "scale"}.get(attr, attr)
    param = getattr(module, ours, None)
    if (
        param is None
        and attr == "weight_g"
        and isinstance(getattr(module, "weight", None), torch.nn.Parameter)
    ):
        return ""
    if not isinstance(param, torch.nn.Parameter):
        return None
    return next((n for n, p in named.items() if p is param), None)


class FreezeParametersHook(VisslHook):
    """Keep the listed parameters unchanged for their first iterations (SwAV's prototypes).

    After backward, while ``task.iteration`` (optimizer steps done) is below a parameter's
    count, its gradient is set to ``None``, so the optimizer leaves it alone (no weight
    decay either), as in VISSL.

    Args:
        frozen: ``{parameter name in the base model: number of iterations}``.
    """

    priority = Priority.HIGH

    def __init__(self, frozen: dict[str, int]) -> None:
        self.frozen = dict(frozen)
        self._params: list[tuple[torch.nn.Parameter, int]] = []

    def on_start(self, task: SelfSupervisionTask) -> None:
        named = dict(task.base_model.named_parameters())
        frozen: dict[str, int] = {}
        for name, iters in self.frozen.items():
            alias = resolve_parameter_name(name, task.base_model, named)
            if alias == "":
                logger.info(
                    "%s: %s is the fixed row norm of a weight-normalised layer "
                    "(normalize_last_layer), never trained: nothing to freeze",
                    _FROZEN_KEY,
                    name,
                )
                continue
            frozen[alias or name] = iters
        self.frozen = frozen
        unknown = sorted(n for n in self.frozen if n not in named)
        if unknown:
            from vissl.utils.registry import closest_match

            hints = [f"{n!r} (closest: {closest_match(n, list(named))!r})" for n in unknown]
            raise ConfigError(
                f"{_FROZEN_KEY} names parameters the model does not have: {', '.join(hints)}. "
                "Use names of model.named_parameters(), e.g. 'heads.0.prototypes0.weight'.",
                _FROZEN_KEY,
            )
        self._params = [(named[n], iters) for n, iters in self.frozen.items()]

    def on_backward(self, task: SelfSupervisionTask) -> None:
        for param, iters in self._params:
            if task.iteration < iters:
                param.grad = None
