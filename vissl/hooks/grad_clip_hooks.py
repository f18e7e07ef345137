"""``GradClipHook``: gradient clipping after backward (``MODEL.GRAD_CLIP``), VISSL's module.

Three rules (``MODEL.GRAD_CLIP.MODE``), each scaling a set of gradients by
``min(1, MAX_NORM / (norm + 1e-6))`` where ``norm`` is the ``NORM_TYPE``-norm of the set:

- ``global`` (VISSL's, the default): one set, every gradient of the model together
  (``torch.nn.utils.clip_grad_norm_``).
- ``per_parameter`` (DINO's and iBOT's ``utils.clip_gradients``): each parameter tensor's
  gradient on its own.
- ``per_module`` (DINOv2's ``train.py``, which clips ``backbone``, ``dino_head`` and
  ``ibot_head`` separately): one set per submodule named in ``MODULES`` (default: the
  trunk and each head, ``trunk``, ``heads.0``, ...).

``EXCLUDE_PARAMS`` leaves out the parameters whose name contains one of its strings (MSN
clips ``encoder.parameters()``, not the prototypes: ``[prototypes]``); their gradients are
neither counted nor scaled.

Cost: the parameter sets are built once per phase, and again when the task's model or
optimizer is replaced or its param groups change size (a signature read from the groups
each step, without walking the module tree); each step reads the gradients of that list,
computes every norm with ``torch._foreach_norm`` and scales with ``torch._foreach_mul_``,
without reading a value back to the host and without a Python frame per parameter (the
layout of a pattern of present gradients, whether any is a DTensor, one device, float32,
is worked out once and kept). Under fp16 the gradients are unscaled first. Under FSDP2
(``self_supervision_fsdp_task``) a gradient is a sharded DTensor: its norm is that of the
whole tensor (the ranks' local norms combined by one all-reduce per step), so every rank
scales alike and the result equals one process's.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import math
import operator
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from vissl.config.validation import GRAD_CLIP_MODES
from vissl.errors import ConfigError
from vissl.hooks.base import VisslHook

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.GRAD_CLIP"
# torch.nn.utils.clip_grad_norm_'s and DINO's clip_gradients' guard against a zero norm
_EPS = 1e-6


def _norm_type(value: Any) -> float:
    if isinstance(value, str) and value.lower() == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(
            f"{_KEY}.NORM_TYPE={value!r} must be a positive number (2 for the Euclidean "
            'norm) or "inf".',
            f"{_KEY}.NORM_TYPE",
        )
    return float(value)


def _names(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(
            f"{_KEY}.{key}={value!r} must be a list of non-empty strings.", f"{_KEY}.{key}"
        )
    return tuple(value)


def default_clip_modules(model: nn.Module) -> list[str]:
    """``per_module``'s default sets: each child of ``model`` with parameters, the items of a
    ``ModuleList`` / ``ModuleDict`` child (``heads``) each on its own: ``trunk``, ``heads.0``..."""
    names: list[str] = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            names.extend(
                f"{name}.{sub}"
                for sub, item in child.named_children()
                if next(item.parameters(), None) is not None
            )
        elif next(child.parameters(), None) is not None:
            names.append(name)
    return names


def _shard_groups(tensor: Any) -> tuple[Any, ...]:
    """The process groups over which ``tensor`` (a DTensor) is sharded; () for a plain one."""
    placements = getattr(tensor, "placements", None)
    if placements is None or not hasattr(tensor, "to_local"):
        return ()
    groups = []
    for dim, placement in enumerate(placements):
        if placement.is_shard():
            groups.append(tensor.device_mesh.get_group(mesh_dim=dim))
        elif not placement.is_replicate():  # a gradient is never a pending (Partial) sum
            raise NotImplementedError(
                f"GradClipHook: a gradient placed as {placement} is not supported."
            )
    return tuple(groups)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None and hasattr(tensor, "placements") else tensor


@dataclass
class _Plan:
    """The clipped parameters of one model, in set order (``group_of[i]`` is the set of
    ``params[i]``), and the per-step layouts by which of them have a gradient."""

    model: weakref.ReferenceType[nn.Module]
    params: list[nn.Parameter]
    group_of: list[int]
    names: list[str]
    #: what the plan was built for besides the model (:func:`_signature`)
    signature: tuple[Any, ...] = ()
    steps: dict[tuple[bool, ...], _StepLayout] = field(default_factory=dict)


@dataclass
class _StepLayout:
    """For one pattern of present gradients: the sets' sizes, the positions of the
    sharded gradients by their shard process groups, and what the step may skip: the
    local shard of each gradient (none is a DTensor), moving the norms to one device
    (all on one already), casting them to float32 (they are)."""

    counts: list[int]
    sharded: list[tuple[tuple[Any, ...], torch.Tensor]]
    local: bool = True
    one_device: bool = False
    float32: bool = False


_NONES = itertools.repeat(None)
_PARAMS = operator.itemgetter("params")


def _signature(optimizer: Any) -> tuple[Any, ...]:
    """A cheap fingerprint of the optimizer's parameters (C calls only, no Python frame per
    group or parameter): its identity and each group's size. A task that replaces its
    optimizer or the params of a group (FSDP wrapping, a new param group) gets a new plan."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return (id(optimizer),)
    return (id(optimizer), *map(len, map(_PARAMS, groups)))


class GradClipHook(VisslHook):
    """Clip gradients after backward (``MODEL.GRAD_CLIP``; see the module docstring).

    Args:
        norm_type: the p of the p-norm (> 0), or ``"inf"``.
        max_norm: the largest norm a clipped set keeps (> 0).
        mode: ``global``, ``per_parameter`` or ``per_module``.
        modules: ``per_module``'s submodule names (``trunk``, ``heads.0``; DDP's ``module.``
            prefix is accepted); empty: the trunk and each head.
        exclude_params: parameters whose name contains one of these are not clipped.

    Raises:
        ConfigError: an invalid value, naming its ``config.MODEL.GRAD_CLIP`` key; a module
            or pattern that matches nothing in the model is refused when the sets are built
            (at the start of training).
    """

    def __init__(
        self,
        norm_type: float | str = 2,
        max_norm: float = 1.0,
        mode: str = "global",
        modules: Sequence[str] = (),
        exclude_params: Sequence[str] = (),
    ) -> None:
        from vissl.utils.vissl_key_maps import config_parameter_name

        self.norm_type = _norm_type(norm_type)
        if isinstance(max_norm, bool) or not isinstance(max_norm, int | float) or max_norm <= 0:
            raise ConfigError(
                f"{_KEY}.MAX_NORM={max_norm!r} must be a positive number.", f"{_KEY}.MAX_NORM"
            )
        self.max_norm = float(max_norm)
        if mode not in GRAD_CLIP_MODES:
            raise ConfigError(
                f"{_KEY}.MODE={mode!r} is not a clipping mode: use one of "
                f"{list(GRAD_CLIP_MODES)} (global: all gradients together, as VISSL; "
                "per_parameter: each parameter's, as DINO / iBOT; per_module: one norm per "
                "submodule, as DINOv2).",
                f"{_KEY}.MODE",
            )
        self.mode = mode
        self.modules = tuple(
            config_parameter_name(m, f"{_KEY}.MODULES") for m in _names(modules, "MODULES")
        )
        if self.modules and mode != "per_module":
            raise ConfigError(
                f"{_KEY}.MODULES={list(modules)!r} is read by MODE per_module only (MODE is "
                f"{mode!r}): set MODE: per_module or remove MODULES.",
                f"{_KEY}.MODULES",
            )
        self.exclude_params = tuple(
            config_parameter_name(s, f"{_KEY}.EXCLUDE_PARAMS")
            for s in _names(exclude_params, "EXCLUDE_PARAMS")
        )
        self._plan: _Plan | None = None

    @classmethod
    def from_config(cls, grad_clip: Mapping[str, Any]) -> GradClipHook:
        """The hook of ``config.MODEL.GRAD_CLIP``."""
        return cls(
            grad_clip.get("NORM_TYPE", 2),
            grad_clip.get("MAX_NORM", 1.0),
            mode=grad_clip.get("MODE", "global"),
            modules=list(grad_clip.get("MODULES") or []),
            exclude_params=list(grad_clip.get("EXCLUDE_PARAMS") or []),
        )

    # ------------------------------------------------------------------ the sets
    def build(self, model: nn.Module, signature: tuple[Any, ...] = ()) -> None:
        """Build the clipped parameter sets of ``model`` (checks MODULES / EXCLUDE_PARAMS);
        ``signature`` is the optimizer's (:func:`_signature`) the plan is valid for."""
        self._plan = self._make_plan(model)
        self._plan.signature = signature

    def _make_plan(self, model: nn.Module) -> _Plan:
        named = list(model.named_parameters())
        unused = [s for s in self.exclude_params if not any(s in n for n, _ in named)]
        if unused:
            raise ConfigError(
                f"{_KEY}.EXCLUDE_PARAMS: {unused!r} matches no parameter of the model (a "
                "parameter is left out when its name contains the string); close names: "
                f"{_close(unused[0], [n for n, _ in named])}.",
                f"{_KEY}.EXCLUDE_PARAMS",
            )
        kept = [(n, p) for n, p in named if not any(s in n for s in self.exclude_params)]
        if self.mode != "per_module":
            group_of = list(range(len(kept))) if self.mode == "per_parameter" else [0] * len(kept)
            return _Plan(weakref.ref(model), [p for _, p in kept], group_of, [n for n, _ in kept])
        modules = list(self.modules) or default_clip_modules(model)
        choices = default_clip_modules(model)
        for name in modules:
            try:
                model.get_submodule(name)
            except AttributeError:
                raise ConfigError(
                    f"{_KEY}.MODULES: {name!r} is not a submodule of the model; use names "
                    f"of its submodules, e.g. {choices} (the default when MODULES is empty).",
                    f"{_KEY}.MODULES",
                ) from None
        by_group: list[list[tuple[str, nn.Parameter]]] = [[] for _ in modules]
        uncovered: list[str] = []
        for pname, param in kept:
            owners = [i for i, m in enumerate(modules) if pname.startswith(f"{m}.")]
            if len(owners) > 1:
                raise ConfigError(
                    f"{_KEY}.MODULES: {[modules[i] for i in owners]} overlap (both hold "
                    f"{pname!r}); list modules that do not contain one another.",
                    f"{_KEY}.MODULES",
                )
            if owners:
                by_group[owners[0]].append((pname, param))
            elif param.requires_grad:
                uncovered.append(pname)
        empty = [m for m, group in zip(modules, by_group, strict=True) if not group]
        if empty:
            raise ConfigError(
                f"{_KEY}.MODULES: {empty!r} hold no clipped parameter (none, or all left "
                f"out by EXCLUDE_PARAMS); the model's modules with parameters: {choices}.",
                f"{_KEY}.MODULES",
            )
        if uncovered:
            raise ConfigError(
                f"{_KEY}.MODULES={modules!r} leaves {len(uncovered)} trainable parameters "
                f"unclipped (e.g. {uncovered[:3]}): add their module to MODULES or their "
                "names to EXCLUDE_PARAMS.",
                f"{_KEY}.MODULES",
            )
        flat = [(g, n, p) for g, group in enumerate(by_group) for n, p in group]
        logger.info(
            "GradClipHook: per_module, one norm for each of %s (%s tensors)",
            modules,
            [len(g) for g in by_group],
        )
        return _Plan(
            weakref.ref(model),
            [p for _, _, p in flat],
            [g for g, _, _ in flat],
            [n for _, n, _ in flat],
        )

    def on_start(self, task: SelfSupervisionTask) -> None:
        self.build(task.base_model, _signature(task.optimizer))

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self.build(task.base_model, _signature(task.optimizer))

    def _current_plan(self, task: SelfSupervisionTask) -> _Plan:
        """The plan of the task's model and optimizer, rebuilt when either changed."""
        model = task.base_model
        plan = self._plan
        signature = _signature(task.optimizer)
        if plan is None or plan.model() is not model or plan.signature != signature:
            self.build(model, signature)
            plan = self._plan
            assert plan is not None
        return plan

    def _layout(self, plan: _Plan, present: tuple[bool, ...], grads: list[Any]) -> _StepLayout:
        layout = plan.steps.get(present)
        if layout is not None:
            return layout
        groups = [g for g, has in zip(plan.group_of, present, strict=True) if has]
        counts = [0] * (max(plan.group_of, default=-1) + 1)
        for g in groups:
            counts[g] += 1
        by_key: dict[tuple[Any, ...], list[int]] = {}
        for i, grad in enumerate(grads):
            key = _shard_groups(grad)
            if key:
                by_key.setdefault(key, []).append(i)
        device = grads[0].device
        sharded = [(k, torch.tensor(v, device=device)) for k, v in by_key.items()]
        locals_ = [_local(g) for g in grads]
        layout = _StepLayout(
            [c for c in counts if c],
            sharded,
            local=any(x is not g for x, g in zip(locals_, grads, strict=True)),
            one_device=all(x.device == locals_[0].device for x in locals_),
            float32=all(x.dtype == torch.float32 for x in locals_),
        )
        plan.steps[present] = layout
        return layout

    def _norms(self, locals_: list[torch.Tensor], layout: _StepLayout) -> torch.Tensor:
        """The norm of each whole gradient, float32, shape (len(locals_),)."""
        p = self.norm_type
        norms_ = list(torch._foreach_norm(locals_, p))
        if not layout.one_device:
            device = locals_[0].device
            norms_ = [n.to(device) for n in norms_]
        norms = torch.stack(norms_)
        if not layout.float32:
            norms = norms.float()
        for groups, index in layout.sharded:
            # the whole tensor's norm from the shards': max for inf, (sum |n_r|^p)^(1/p)
            part = norms.index_select(0, index)
            if math.isinf(p):
                for group in groups:
                    dist.all_reduce(part, op=dist.ReduceOp.MAX, group=group)
            else:
                part = part.pow(p)
                for group in groups:
                    dist.all_reduce(part, op=dist.ReduceOp.SUM, group=group)
                part = part.pow(1.0 / p)
            norms = norms.index_copy(0, index, part)
        return norms

    def _coefficient(self, norm: torch.Tensor) -> torch.Tensor:
        return (self.max_norm / (norm + _EPS)).clamp(max=1.0)

    # ------------------------------------------------------------------ the step
    def on_backward(self, task: SelfSupervisionTask) -> None:
        task.precision.unscale_(task.optimizer)
        plan = self._current_plan(task)
        if self.mode == "global":
            params = [p for p in plan.params if p.grad is not None]
            if params:
                torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type)
            return
        # (C-level iteration only: no Python frame per parameter)
        every = [p.grad for p in plan.params]
        present = tuple(map(operator.is_not, every, _NONES))
        grads: list[Any] = every if all(present) else list(itertools.compress(every, present))
        if not grads:
            return
        layout = self._layout(plan, present, grads)
        locals_ = [_local(g) for g in grads] if layout.local else grads
        norms = self._norms(locals_, layout)
        if self.mode == "per_parameter":
            coefficients = self._coefficient(norms)
            torch._foreach_mul_(locals_, list(coefficients.unbind()))
            return
        sets = torch.split(norms, layout.counts)
        set_norms = torch.stack([torch.linalg.vector_norm(s, self.norm_type) for s in sets])
        coefficients = self._coefficient(set_norms)
        start = 0
        for s, count in enumerate(layout.counts):
            torch._foreach_mul_(locals_[start : start + count], coefficients[s])
            start += count


def _close(name: str, names: Sequence[str]) -> list[str]:
    short = sorted({n.rsplit(".", 1)[0] for n in names})
    return difflib.get_close_matches(name, short, n=5, cutoff=0.0) or short[:5]
