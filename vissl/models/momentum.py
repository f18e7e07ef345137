"""Momentum (EMA) copies of a model: MoCo's key encoder, SwAV's momentum encoder, teachers.

The copy is made once, from the model the task built (before it is wrapped in DDP or
compiled), holds no gradients and is never given to the optimizer. Its parameters follow
the model's by an exponential moving average::

    target = momentum * target + (1 - momentum) * source

Buffers (BatchNorm running statistics) are not averaged: the copy's own forward passes
in train mode update them, as in MoCo. A copy that never runs in train mode (the
``HOOKS.EMA_MODEL`` average) copies them from the model instead
(:func:`ema_update_tensors_`).
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from fvcore.common import param_scheduler as fv
from torch import nn

__all__ = [
    "DROPPED_PREFIXES_ATTR",
    "MOMENTUM_COPY_ATTR",
    "MOMENTUM_SCHEDULES",
    "EmaTensors",
    "HostSnapshot",
    "LinearMomentumScheduler",
    "MomentumTeacher",
    "build_momentum_schedule",
    "copy_buffers_",
    "copy_tensors_",
    "cosine_momentum",
    "ema_tensors",
    "ema_update_",
    "ema_update_tensors_",
    "forget_pairing",
    "is_momentum_copy",
    "momentum_copies",
    "momentum_copy",
    "reset_momentum_copy_",
    "schedule_position",
    "set_teacher_mode",
]


def _plain(model: nn.Module) -> nn.Module:
    """``model`` without DDP / ``torch.compile`` wrappers."""
    seen = 0
    while seen < 4:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
        seen += 1
    return model


#: Set on every copy :func:`momentum_copy` makes, so that code that must treat the copies
#: like the model (weights initialisation, compile) finds them: see :func:`momentum_copies`.
MOMENTUM_COPY_ATTR = "_vissl_momentum_copy"


def _shared_handles(model: nn.Module) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo that keeps process groups shared, not copied.

    A ``SyncBatchNorm`` over a sub-group (``MODEL.SYNC_BN_CONFIG.GROUP_SIZE``) holds a
    ``ProcessGroup``, a handle to communicators that cannot be pickled or copied: the copy
    must synchronise over the same group as the model.
    """
    if not dist.is_available():
        return {}
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, dist.ProcessGroup):
                memo[id(value)] = value
    return memo


#: Set on a copy made with ``drop_last_heads``: the name prefixes (``heads.<i>``) of the
#: model's modules the copy leaves out, which the EMA pairing skips.
DROPPED_PREFIXES_ATTR = "_vissl_dropped_prefixes"


def momentum_copy(model: nn.Module, drop_last_heads: int = 0) -> nn.Module:
    """A frozen deep copy of ``model`` (no gradients), on the same device, in train mode.

    Process groups the model's layers hold (SyncBatchNorm over sub-groups) are shared
    with the copy. The copy is marked (see :func:`momentum_copies`).

    Args:
        model: the model (wrappers are seen through).
        drop_last_heads: leave the last ``k`` modules of ``model.heads`` out of the copy:
            BYOL's and MoCo v3's target network is the model without its predictor (the
            last head of a ``[projector, predictor]`` chain). The EMA updates
            (:func:`ema_update_`, :func:`ema_tensors`) pair the remaining parameters.

    Raises:
        ValueError: ``drop_last_heads`` is negative or not below the number of heads.
    """
    plain = _plain(model)
    target = copy.deepcopy(plain, memo=_shared_handles(plain))
    if drop_last_heads:
        heads = getattr(target, "heads", None)
        if not isinstance(heads, nn.ModuleList) or not 0 < drop_last_heads < len(heads):
            count = len(heads) if isinstance(heads, nn.ModuleList) else 0
            raise ValueError(
                f"cannot drop the last {drop_last_heads} heads of a model with {count} heads "
                "(the copy needs at least one: the projector)."
            )
        kept = len(heads) - drop_last_heads
        dropped = tuple(f"heads.{i}" for i in range(kept, len(heads)))
        for _ in range(drop_last_heads):
            del heads[-1]
        setattr(target, DROPPED_PREFIXES_ATTR, dropped)
    for param in target.parameters():
        param.requires_grad_(False)
    setattr(target, MOMENTUM_COPY_ATTR, True)
    return target


def _without_dropped(target: nn.Module, source: dict[str, Any]) -> dict[str, Any]:
    """``source``'s named tensors less those of the modules ``target`` left out."""
    dropped = getattr(target, DROPPED_PREFIXES_ATTR, ())
    if not dropped:
        return source
    return {n: t for n, t in source.items() if not any(n.startswith(p + ".") for p in dropped)}


def is_momentum_copy(module: Any) -> bool:
    """Whether ``module`` was made by :func:`momentum_copy`."""
    return isinstance(module, nn.Module) and bool(getattr(module, MOMENTUM_COPY_ATTR, False))


def momentum_copies(owner: Any) -> list[nn.Module]:
    """The momentum copies ``owner`` holds (a loss, a hook, any object), outermost only.

    A module is searched through (``owner.modules()``); any other object through its
    attributes (e.g. ``EmaHook.model``), one level deep.
    """
    found: list[nn.Module] = []
    seen: set[int] = set()

    def visit(module: nn.Module) -> None:
        for m in module.modules():
            if id(m) in seen:
                continue
            if is_momentum_copy(m):
                found.append(m)
                seen.update(id(x) for x in m.modules())
            else:
                seen.add(id(m))

    if isinstance(owner, nn.Module):
        visit(owner)
    else:
        for value in list(vars(owner).values()) if hasattr(owner, "__dict__") else []:
            if isinstance(value, nn.Module):
                visit(value)
    return found


@torch.no_grad()
def reset_momentum_copy_(target: nn.Module, source: nn.Module) -> None:
    """Make ``target`` (a momentum copy) equal to ``source``: parameters and buffers.

    Used after ``MODEL.WEIGHTS_INIT`` loads weights into the model the copy was made
    from: the copy must start from the loaded weights, not the random init.
    """
    tensors = ema_tensors(target, source)
    copy_tensors_(tensors.target_params, [s.detach() for s in tensors.source_params])
    copy_tensors_(tensors.target_buffers, tensors.source_buffers)


def cosine_momentum(iteration: int, max_iteration: int, base: float) -> float:
    """The cosine momentum schedule of DINO and BYOL: from ``base`` at iteration 0 to 1 at
    ``max_iteration``, ``1 - (1 - base) * (cos(pi * t / T) + 1) / 2``."""
    if max_iteration <= 0:
        return base
    progress = min(max(iteration / max_iteration, 0.0), 1.0)
    return 1.0 - (1.0 - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


@dataclass
class _Pairing:
    """The parameters of a momentum copy paired with those of the model it follows, and
    what the per-step update needs to know about them, worked out once per pairing."""

    source: weakref.ReferenceType[nn.Module]
    target_params: list[torch.Tensor]
    source_params: list[torch.Tensor]
    #: every pair shares its dtype and device: the lerp takes the source's tensors as
    #: they are (otherwise they are converted to the target's each step)
    same_kind: bool


#: target -> its :class:`_Pairing`, so that a per-step update does no name lookups and no
#: Python loop over the parameters (see :func:`ema_update_`).
_PAIRS: weakref.WeakKeyDictionary[nn.Module, _Pairing] = weakref.WeakKeyDictionary()


def _same_kind(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> bool:
    return all(d.dtype == s.dtype and d.device == s.device for d, s in zip(dst, src, strict=True))


def _pairing(target: nn.Module, source: nn.Module) -> _Pairing:
    cached = _PAIRS.get(target)
    if cached is not None and cached.source() is source:
        return cached
    target_params = dict(target.named_parameters())
    source_params = _without_dropped(target, dict(source.named_parameters()))
    if target_params.keys() != source_params.keys():
        missing = sorted(source_params.keys() ^ target_params.keys())[:5]
        raise ValueError(
            f"the momentum copy and the model differ in their parameters (e.g. {missing}); "
            "the copy must be made from the model it follows."
        )
    names = list(source_params)
    dst: list[torch.Tensor] = [target_params[n] for n in names]
    src: list[torch.Tensor] = [source_params[n] for n in names]
    pairing = _Pairing(weakref.ref(source), dst, src, _same_kind(dst, src))
    _PAIRS[target] = pairing
    return pairing


def _paired_parameters(
    target: nn.Module, source: nn.Module
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pairing = _pairing(target, source)
    return pairing.target_params, pairing.source_params


def forget_pairing(target: nn.Module) -> None:
    """Drop the cached pairing of ``target`` (the next :func:`ema_update_` pairs again and
    re-checks dtypes and devices): call it after moving or casting part of the model or
    of its copy in place (``.to(dtype)`` of a submodule). :class:`MomentumTeacher` calls it
    at each phase start (:meth:`MomentumTeacher.refresh`)."""
    _PAIRS.pop(target, None)


@torch.no_grad()
def ema_update_(target: nn.Module, source: nn.Module, momentum: float) -> None:
    """``target.p = momentum * target.p + (1 - momentum) * source.p`` for every parameter.

    One foreach lerp. The parameters are paired by name at the first call and the pairs
    kept (per target, while it follows the same source), with whether every pair shares
    its dtype and device: a per-step call does no name lookups and no Python loop over
    the parameters. Parameters are held as objects, so moving or casting a whole model
    (``.to``, seen on the first pair) or loading a state dict keeps the pairs valid;
    replacing a parameter object does not. Casting or moving only part of either model
    in place after the first call needs :func:`forget_pairing`; an update that finds such
    a mismatch raises instead of averaging across dtypes.

    Args:
        target: the momentum copy (from :func:`momentum_copy`).
        source: the model being trained (wrappers are seen through).
        momentum: in [0, 1]; 1 keeps ``target``, 0 copies ``source``.

    Raises:
        ValueError: the two models do not have the same parameters.
    """
    pairing = _pairing(target, _plain(source))
    dst, src = pairing.target_params, pairing.source_params
    if not dst:
        return
    d0, s0 = dst[0], src[0]
    if not pairing.same_kind or d0.dtype != s0.dtype or d0.device != s0.device:
        # the pairs were unlike, or the whole of one model was moved or cast since
        pairing.same_kind = _same_kind(dst, src)
    if not pairing.same_kind:
        src = [s.to(device=d.device, dtype=d.dtype) for d, s in zip(dst, src, strict=True)]
        torch._foreach_lerp_(dst, src, 1.0 - float(momentum))
        return
    try:
        torch._foreach_lerp_(dst, src, 1.0 - float(momentum))
    except RuntimeError:
        if _same_kind(dst, src):
            raise
        _PAIRS.pop(target, None)
        raise RuntimeError(
            "ema_update_: a parameter of the model or of its momentum copy changed dtype or "
            "device in place after the two were paired (the copy is now partly updated); "
            "call vissl.models.momentum.forget_pairing(copy) after casting or moving part "
            "of either model."
        ) from None


@dataclass(frozen=True)
class EmaTensors:
    """The tensors of a momentum copy and of the model it follows, matched by name.

    Gathered once (:func:`ema_tensors`) so that each update is one foreach call, with no
    per-step name lookups. Valid while the model's parameters and buffers are updated in
    place (optimizer steps, ``load_state_dict``), which is how the trainer changes them.
    """

    target_params: list[torch.Tensor]
    source_params: list[torch.Tensor]
    target_buffers: list[torch.Tensor]
    source_buffers: list[torch.Tensor]
    #: every parameter pair shares its dtype and device, every buffer pair its device
    #: (when gathered): an update from the source's own tensors makes no per-pair list
    same_kind: bool = False


def _matched(
    target: dict[str, torch.Tensor], source: dict[str, torch.Tensor], what: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if target.keys() != source.keys():
        differ = sorted(source.keys() ^ target.keys())[:5]
        raise ValueError(
            f"the momentum copy and the model differ in their {what} (e.g. {differ}); "
            "the copy must be made from the model it follows."
        )
    bad = [n for n in source if source[n].shape != target[n].shape][:5]
    if bad:
        raise ValueError(f"the momentum copy and the model differ in the shape of {bad}.")
    names = list(source)
    return [target[n] for n in names], [source[n] for n in names]


def ema_tensors(target: nn.Module, source: nn.Module) -> EmaTensors:
    """Pair ``target``'s parameters and buffers with ``source``'s (wrappers are seen through).

    Raises:
        ValueError: the two models do not have the same parameter and buffer names/shapes.
    """
    source = _plain(source)
    tp, sp = _matched(
        {n: p.data for n, p in target.named_parameters()},
        _without_dropped(target, dict(source.named_parameters())),
        "parameters",
    )
    tb, sb = _matched(
        dict(target.named_buffers()),
        _without_dropped(target, dict(source.named_buffers())),
        "buffers",
    )
    same = _same_kind(tp, sp) and all(t.device == s.device for t, s in zip(tb, sb, strict=True))
    return EmaTensors(tp, sp, tb, sb, same)


@torch.no_grad()
def ema_update_tensors_(
    tensors: EmaTensors,
    momentum: float,
    copy_buffers: bool = True,
    source_values: list[torch.Tensor] | None = None,
) -> None:
    """``target = momentum * target + (1 - momentum) * source`` for the paired parameters.

    Buffers (BatchNorm running statistics, counters) are copied from the source when
    ``copy_buffers`` is set. On one device and dtype this is one foreach lerp (and one
    foreach copy) with no other allocation; a target on another device (e.g. an EMA kept
    on the CPU) first copies the source's tensors there.

    Args:
        tensors: from :func:`ema_tensors`.
        momentum: in [0, 1]; 1 keeps the target, 0 copies the source.
        copy_buffers: also copy the buffers.
        source_values: the source's parameters then buffers as taken earlier (e.g. a
            :class:`HostSnapshot`), used instead of the source's current tensors.
    """
    dst = tensors.target_params
    if source_values is None and tensors.same_kind:
        if dst:
            torch._foreach_lerp_(dst, tensors.source_params, 1.0 - float(momentum))
        if copy_buffers and tensors.target_buffers:
            torch._foreach_copy_(tensors.target_buffers, tensors.source_buffers)
        return
    sources = [*tensors.source_params, *tensors.source_buffers]
    if source_values is not None:
        sources = source_values
    src = [
        s if s.device == d.device and s.dtype == d.dtype else s.to(device=d.device, dtype=d.dtype)
        for d, s in zip(dst, sources[: len(dst)], strict=True)
    ]
    if dst:
        torch._foreach_lerp_(dst, src, 1.0 - float(momentum))
    if copy_buffers:
        copy_tensors_(tensors.target_buffers, sources[len(dst) :])


class HostSnapshot:
    """Snapshots of device tensors in (pinned) host memory, taken without a host wait.

    :meth:`launch` concatenates the tensors of each dtype on their device and starts one
    ``non_blocking`` copy per dtype into a pinned host buffer; :meth:`wait` returns host
    views shaped like the tensors, once those copies are done (by then, usually long
    done). The values are those the tensors had when :meth:`launch` was called, in the
    device's stream order. Used by an EMA kept on the CPU of a model on a GPU: one flat
    copy per update instead of one blocking copy per tensor.

    Args:
        tensors: tensors on one device (the model's parameters and buffers).
    """

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        pin = bool(tensors) and tensors[0].is_cuda
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        self._groups = [
            (
                index,
                torch.empty(sum(tensors[i].numel() for i in index), dtype=dtype, pin_memory=pin),
            )
            for dtype, index in by_dtype.items()
        ]
        self._event: Any = None

    @torch.no_grad()
    def launch(self) -> None:
        """Start copying the tensors' current values to the host (no host wait)."""
        for index, host in self._groups:
            flat = torch.cat([self.tensors[i].detach().reshape(-1) for i in index])
            host.copy_(flat, non_blocking=True)
        if self.tensors and self.tensors[0].is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> list[torch.Tensor]:
        """Host views of the values :meth:`launch` copied, in the order of the tensors."""
        if self._event is not None:
            self._event.synchronize()  # recorded a step ago: normally already complete
            self._event = None
        views: list[torch.Tensor] = [torch.empty(0)] * len(self.tensors)
        for index, host in self._groups:
            offset = 0
            for i in index:
                n = self.tensors[i].numel()
                views[i] = host[offset : offset + n].view_as(self.tensors[i])
                offset += n
        return views


@torch.no_grad()
def copy_buffers_(tensors: EmaTensors) -> None:
    """Copy the source's buffers into the target's (one foreach copy when they share
    devices, worked out when the tensors were gathered)."""
    if tensors.same_kind:
        if tensors.target_buffers:
            torch._foreach_copy_(tensors.target_buffers, tensors.source_buffers)
        return
    copy_tensors_(tensors.target_buffers, tensors.source_buffers)


@torch.no_grad()
def copy_tensors_(target: list[torch.Tensor], source: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for each pair (one foreach call when every pair shares a device)."""
    if not target:
        return
    if all(t.device == s.device for t, s in zip(target, source, strict=True)):
        torch._foreach_copy_(target, source)
    else:
        for t, s in zip(target, source, strict=True):
            t.copy_(s)


# --------------------------------------------------------------------------- the teacher
def set_teacher_mode(teacher: nn.Module) -> None:
    """Eval mode (no dropout, no drop path) except BatchNorm, which uses batch statistics
    (the teachers of DINO, iBOT, DINOv2, MSN and I-JEPA)."""
    teacher.eval()
    for module in teacher.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train()


class LinearMomentumScheduler(fv.ParamScheduler):
    """``start + (end - start) * where``: I-JEPA's linear EMA factor.

    Not fvcore's ``LinearParamScheduler`` (the registered ``linear``), which computes
    ``where * end + (1 - where) * start``: equal in exact arithmetic, but not in the last
    bit, and the teachers must keep their trained weights bitwise.
    """

    def __init__(self, start_value: float, end_value: float) -> None:
        self._start_value = float(start_value)
        self._end_value = float(end_value)

    def __call__(self, where: float) -> float:
        return self._start_value + (self._end_value - self._start_value) * where


#: The momentum schedules of a :class:`MomentumTeacher`, by name.
MOMENTUM_SCHEDULES = ("constant", "cosine", "linear")


def build_momentum_schedule(
    name: str, start: float, end: float = 1.0, key: str = "momentum_schedule"
) -> fv.ParamScheduler:
    """The EMA factor's schedule over training (``where`` from 0 to 1).

    - ``constant``: ``start`` throughout (MoCo v2, SwAV's momentum encoder);
    - ``cosine``: the half cosine from ``start`` to ``end`` (DINO, iBOT, DINOv2, MSN,
      BYOL, MoCo v3), fvcore's ``CosineParamScheduler`` (the registered ``cosine``);
    - ``linear``: from ``start`` to ``end`` (I-JEPA), :class:`LinearMomentumScheduler`.

    Raises:
        ConfigError: an unknown ``name`` (naming ``key`` and the valid names).
    """
    if name == "constant":
        return fv.ConstantParamScheduler(float(start))
    if name == "cosine":
        return fv.CosineParamScheduler(float(start), float(end))
    if name == "linear":
        return LinearMomentumScheduler(start, end)
    from vissl.errors import ConfigError
    from vissl.utils.registry import closest_match

    hint = closest_match(str(name), list(MOMENTUM_SCHEDULES))
    raise ConfigError(
        f"{key}: unknown momentum schedule {name!r}"
        + (f" (did you mean {hint!r}?)" if hint else "")
        + f"; choose one of {list(MOMENTUM_SCHEDULES)}.",
        key,
    )


def schedule_position(iteration: int, max_iteration: int) -> float | None:
    """``iteration / max_iteration`` clamped to [0, 1]; None when the length is unknown
    (``max_iteration <= 0``: the schedule's start value is used)."""
    if max_iteration <= 0:
        return None
    return min(max(iteration / max_iteration, 0.0), 1.0)


class MomentumTeacher(nn.Module):
    """A frozen EMA copy of a model (the *teacher*) and its momentum schedule.

    The one teacher of every momentum method: DINO, iBOT, DINOv2 and MSN's teacher,
    MoCo's and SwAV's momentum encoder, BYOL's and MoCo v3's target network, I-JEPA's
    target encoder (VISSL's names for the same thing). It holds:

    - ``module``: the copy (:func:`momentum_copy`), no gradients, never optimised;
    - ``schedule``: a ``ParamScheduler`` of the EMA factor at ``where`` in [0, 1]
      (:func:`build_momentum_schedule`);
    - ``last_momentum``: the factor of the last :meth:`update` (what is logged).

    ``forward`` runs the copy without gradients; the caller chooses the precision
    (the trainer runs it under the task's autocast, on inputs already channels-last as
    the student's). :meth:`update` moves the copy towards the student::

        teacher = m * teacher + (1 - m) * student,   m = schedule(where)

    A loss keeps the copy itself as its submodule (so the checkpoint keys are the copy's,
    e.g. ``loss.teacher.*``); this object drives it. Usable alone, from a plain loop::

        teacher = MomentumTeacher(model, build_momentum_schedule("cosine", 0.996))
        with torch.no_grad():
            t = teacher(x)
        ...  # the student's step
        teacher.update(model, where=step / total_steps)

    Args:
        model: the student (wrappers are seen through), or an existing copy with
            ``copy=False``.
        schedule: the EMA factor's schedule (a ``ParamScheduler``, or a float: constant).
        drop_last_heads: see :func:`momentum_copy` (BYOL, MoCo v3: no predictor).
        teacher_mode: run the copy in eval mode except BatchNorm (:func:`set_teacher_mode`);
            otherwise the copy follows ``train()`` / ``eval()`` like any module.
        copy_buffers: :meth:`update` also copies the student's buffers (SwAV's momentum
            encoder normalises with the model's BatchNorm statistics).
        copy: make a copy of ``model``; False: ``model`` is already the copy.
    """

    def __init__(
        self,
        model: nn.Module,
        schedule: fv.ParamScheduler | float,
        *,
        drop_last_heads: int = 0,
        teacher_mode: bool = True,
        copy_buffers: bool = False,
        copy: bool = True,
    ) -> None:
        super().__init__()
        self.module = momentum_copy(model, drop_last_heads) if copy else model
        self.schedule = (
            schedule
            if isinstance(schedule, fv.ParamScheduler)
            else fv.ConstantParamScheduler(float(schedule))
        )
        self.teacher_mode = bool(teacher_mode)
        self.copy_buffers = bool(copy_buffers)
        self.last_momentum = float(self.schedule(0.0))
        self._tensors: EmaTensors | None = None
        self._paired_with: tuple[weakref.ref[nn.Module], weakref.ref[nn.Module]] | None = None
        if self.teacher_mode:
            set_teacher_mode(self.module)

    def train(self, mode: bool = True) -> MomentumTeacher:
        super().train(mode)
        if self.teacher_mode:
            set_teacher_mode(self.module)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The copy's output, without gradients."""
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def momentum_at(self, where: float | None) -> float:
        """The EMA factor at ``where`` in [0, 1] (None: the schedule's start value)."""
        if where is None:
            start = getattr(self.schedule, "_start_value", getattr(self.schedule, "_value", None))
            return float(self.schedule(0.0) if start is None else start)
        return float(self.schedule(where))

    def paired_tensors(self, student: nn.Module) -> EmaTensors:
        """The copy's and the student's parameters and buffers, paired once (while the
        copy follows the same student)."""
        owners = self._paired_with
        if (
            self._tensors is None
            or owners is None
            or owners[0]() is not self.module
            or owners[1]() is not student
        ):
            self._tensors = ema_tensors(self.module, student)
            self._paired_with = (weakref.ref(self.module), weakref.ref(student))
        return self._tensors

    def refresh(self) -> None:
        """Pair the copy with the student again at the next update (and re-check their
        dtypes and devices): once per phase, and after either was moved or cast."""
        forget_pairing(self.module)
        self._tensors = None
        self._paired_with = None

    @torch.no_grad()
    def update(self, student: nn.Module, where: float | None) -> float:
        """One EMA step towards ``student`` at ``where``; returns the factor used."""
        momentum = self.momentum_at(where)
        if self.copy_buffers:
            ema_update_tensors_(self.paired_tensors(student), momentum, copy_buffers=True)
        else:
            ema_update_(self.module, student, momentum)
        self.last_momentum = momentum
        return momentum

    def extra_repr(self) -> str:
        return f"schedule={type(self.schedule).__name__}, copy_buffers={self.copy_buffers}"


@dataclass(frozen=True)
class TeacherStep:
    """Where training is, for a teacher's per-step inputs (temperatures, queues).

    Attributes:
        iteration: optimizer steps done (``task.iteration``).
        epoch: the train phase (``task.train_phase_idx``, at least 0).
        train: whether the phase trains.
        channels_last: whether the run feeds images channels-last (``MODEL.CHANNELS_LAST``):
            inputs the step did not convert (e.g. MoCo's key views) are converted alike.
    """

    iteration: int = 0
    epoch: int = 0
    train: bool = True
    channels_last: bool = False


class MomentumTeacherOwner:
    """Mixin of a loss (an ``nn.Module``) that owns a :class:`MomentumTeacher`.

    The copy is the loss's submodule under ``teacher_state_key``: VISSL's name of the
    method, so that its checkpoint keys stay ``loss.<key>.*`` (``teacher`` for DINO, iBOT,
    DINOv2 and MSN, ``momentum_encoder`` for MoCo and SwAV, ``target_network`` for BYOL
    and MoCo v3, ``target_encoder`` for I-JEPA). In code it is ``loss.teacher`` for every
    method; VISSL's attribute names are aliases of it.

    A subclass makes the teacher in ``bind_model`` (:meth:`attach_teacher`) and says what
    the loss takes from it (:meth:`teacher_loss_inputs`, the keyword arguments of its
    ``forward``). :class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook` (its
    ``required_hooks``) runs it in the trainer; the loss never needs the hook: a plain
    loop passes the same arguments itself.
    """

    teacher_state_key: str = "teacher"

    # ----------------------------------------------------------------- the copy
    def attach_teacher(self, teacher: MomentumTeacher) -> None:
        """Hold ``teacher``: its copy as the submodule ``teacher_state_key``."""
        assert isinstance(self, nn.Module)
        self.__dict__["_momentum_teacher"] = teacher
        self._modules[self.teacher_state_key] = teacher.module

    @property
    def momentum_teacher(self) -> MomentumTeacher | None:
        """The teacher driving the copy (None before ``bind_model``)."""
        assert isinstance(self, nn.Module)
        copy_ = self._modules.get(self.teacher_state_key)
        driver: MomentumTeacher | None = self.__dict__.get("_momentum_teacher")
        if copy_ is None:
            return None
        if driver is None or driver.module is not copy_:
            # a copy set by hand (``loss.teacher = module``): driven with the loss's schedule
            driver = MomentumTeacher(
                copy_, self.momentum_schedule(), copy=False, teacher_mode=self.teacher_mode
            )
            self.__dict__["_momentum_teacher"] = driver
        return driver

    @property
    def teacher(self) -> nn.Module | None:
        """The frozen copy (None before ``bind_model``)."""
        assert isinstance(self, nn.Module)
        return self._modules.get(self.teacher_state_key)

    # VISSL's names of the same copy
    momentum_encoder = teacher
    target_network = teacher
    target_encoder = teacher

    #: the copy runs in eval mode except BatchNorm (:func:`set_teacher_mode`)
    teacher_mode: bool = True

    def momentum_schedule(self) -> fv.ParamScheduler:
        """The EMA factor's schedule (the loss's ``momentum`` keys)."""
        raise NotImplementedError

    def train(self, mode: bool = True) -> Any:
        out = super().train(mode)  # type: ignore[misc]
        teacher = self.teacher
        if teacher is not None and self.teacher_mode:
            set_teacher_mode(teacher)
        return out

    # ----------------------------------------------------------------- the trainer
    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The keyword arguments of ``forward`` this batch takes from the teacher (its
        output, temperatures ...), run by the caller without gradients under the run's
        precision."""
        raise NotImplementedError

    @staticmethod
    def given_teacher_output(teacher_output: Any, loss_name: str) -> Any:
        """``forward``'s ``teacher_output`` argument, checked to be there.

        Raises:
            TypeError: it is None, saying how to pass it.
        """
        if teacher_output is None:
            raise TypeError(
                f"{loss_name} needs the teacher's output: call loss(output, target, "
                "teacher_output=teacher(inputs)) (in the trainer MomentumTeacherHook, "
                "declared in required_hooks, passes it)."
            )
        return teacher_output
