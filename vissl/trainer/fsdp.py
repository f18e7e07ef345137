"""Sharded data parallelism with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Selected by VISSL's ``TRAINER.TASK_NAME: self_supervision_fsdp_task`` and configured by
``MODEL.FSDP_CONFIG``. Every parameter is split on its first dimension over the ranks;
a *unit* (a trunk block, a head, the rest of the model) is all-gathered just before its
forward and backward and freed afterwards, and gradients are reduce-scattered, so each
rank keeps 1/N of the parameters, gradients and optimizer state.

Units (the wrap policy):

- ``FSDP_CONFIG.AUTO_WRAP_THRESHOLD > 0`` (VISSL's): bottom-up, every module whose
  parameters not yet in a unit number at least the threshold becomes a unit (fairscale's
  size-based policy);
- ``FSDP_CONFIG.WRAP_MODULES``: every module of these class names (e.g. ``[Block]``);
- neither: the trunk's blocks (the children of an ``nn.Sequential`` / ``nn.ModuleList``
  holding several modules of one class, and every other module of that class: ResNet /
  RegNet blocks, ViT / XCiT blocks) and each head.

The whole model is the last (root) unit. A loss's momentum copies (DINO's teacher, MoCo's
key encoder, SwAV's momentum encoder) and the ``HOOKS.EMA_MODEL`` average are sharded with
the same units, so their EMA update is a local operation on matching shards, with no
gather.

Mixed precision (``mixed_precision``, ``compute_dtype``, ``fp32_reduce_scatter``) maps to
``MixedPrecisionPolicy``, BatchNorm layers staying in float32 (units of their own); ``RESHARD_AFTER_FORWARD`` and ``CPU_OFFLOAD``
(``CPUOffloadPolicy``, CUDA only) to ``fully_shard``'s arguments. fairscale keys with no
FSDP2 meaning are accepted; what each maps to is logged once (:func:`fairscale_notes`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.trainer.gradient_reduction import NoReduction
from vissl.utils.distributed import broadcast_coalesced, get_world_size

logger = logging.getLogger(__name__)

#: ``TRAINER.TASK_NAME`` of the sharded task (VISSL's name).
FSDP_TASK_NAME = "self_supervision_fsdp_task"

_KEY = "config.MODEL.FSDP_CONFIG"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

#: fairscale keys with no FSDP2 meaning: (neutral value, what it maps to here).
FAIRSCALE_ONLY_KEYS: dict[str, tuple[Any, str]] = {
    "AUTO_SETUP_FSDP": (
        False,
        "not needed: the *_fsdp trunk/head/optimizer names are aliases of the plain ones",
    ),
    "AMP_TYPE": ("01", "apex opt level: mixed precision comes from MODEL.AMP_PARAMS"),
    "flatten_parameters": (
        True,
        "FSDP2 shards each parameter on its first dimension; there is nothing to flatten",
    ),
    "bucket_cap_mb": (0, "FSDP2 reduce-scatters one unit at a time; there are no buckets"),
    "clear_autocast_cache": (True, "torch.autocast clears its cache itself"),
}


def is_fsdp_task(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (the ``config`` section) selects the sharded task."""
    return str(config["TRAINER"]["TASK_NAME"]) == FSDP_TASK_NAME


@dataclass
class FSDPSettings:
    """``MODEL.FSDP_CONFIG``, read and checked once."""

    auto_wrap_threshold: int = 0
    wrap_modules: list[str] = field(default_factory=list)
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    force_sync_cuda: bool = False
    verbose: bool = True

    @classmethod
    def from_config(cls, fsdp: Mapping[str, Any], device: torch.device) -> FSDPSettings:
        """Read ``MODEL.FSDP_CONFIG`` for ``device``.

        Raises:
            ConfigError: an unknown ``compute_dtype`` or a negative threshold.
        """
        threshold = int(fsdp.get("AUTO_WRAP_THRESHOLD", 0) or 0)
        if threshold < 0:
            raise ConfigError(
                f"{_KEY}.AUTO_WRAP_THRESHOLD={threshold} must be >= 0 (0: shard the trunk's "
                "blocks and each head).",
                f"{_KEY}.AUTO_WRAP_THRESHOLD",
            )
        name = str(fsdp.get("compute_dtype", "float32")).lower()
        if name not in _DTYPES:
            raise ConfigError(
                f"{_KEY}.compute_dtype={name!r} is not a dtype: use float32, float16 or bfloat16.",
                f"{_KEY}.compute_dtype",
            )
        compute = _DTYPES[name]
        if compute == torch.float16 and device.type != "cuda":
            logger.warning(
                "%s.compute_dtype=float16 needs CUDA: computing in bfloat16 on %s.",
                _KEY,
                device.type,
            )
            compute = torch.bfloat16
        mixed = bool(fsdp.get("mixed_precision", False)) and compute != torch.float32
        param_dtype = compute if mixed else None
        reduce_dtype = torch.float32 if mixed and fsdp.get("fp32_reduce_scatter") else None
        cpu_offload = bool(fsdp.get("CPU_OFFLOAD", False))
        if cpu_offload and device.type != "cuda":
            logger.info("%s.CPU_OFFLOAD: the model already lives on the CPU; not used", _KEY)
            cpu_offload = False
        return cls(
            auto_wrap_threshold=threshold,
            wrap_modules=[str(m) for m in fsdp.get("WRAP_MODULES") or []],
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            reshard_after_forward=bool(fsdp.get("RESHARD_AFTER_FORWARD", True)),
            cpu_offload=cpu_offload,
            force_sync_cuda=bool(fsdp.get("FORCE_SYNC_CUDA", False)) and device.type == "cuda",
            verbose=bool(fsdp.get("verbose", True)),
        )


def fairscale_notes(fsdp: Mapping[str, Any]) -> list[str]:
    """One line per fairscale-only key set away from its neutral value: what it maps to."""
    notes = []
    for key, (neutral, meaning) in FAIRSCALE_ONLY_KEYS.items():
        if key in fsdp and fsdp[key] != neutral:
            notes.append(f"{_KEY}.{key}={fsdp[key]!r}: {meaning}.")
    return notes


# ---------------------------------------------------------------------- units
def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _block_units(trunk: nn.Module) -> list[tuple[str, nn.Module]]:
    """The trunk's blocks: children of a Sequential/ModuleList holding several modules of
    one class (the outermost such, in module order), and the other modules of their
    classes."""
    found: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        children = list(module.named_children())
        if isinstance(module, nn.Sequential | nn.ModuleList):
            with_params = [(n, c) for n, c in children if _param_count(c) > 0]
            kinds = {type(c) for _, c in with_params}
            if len(with_params) > 1 and len(kinds) == 1:
                found.extend((f"{prefix}{n}", c) for n, c in with_params)
                return
        for n, c in children:
            visit(f"{prefix}{n}.", c)

    visit("", trunk)
    # a stage of one block (RegNet's last): every other module of a block's class
    classes = {type(m) for _, m in found}
    chosen = {id(m) for _, m in found}
    inside = {id(x) for _, m in found for x in m.modules()}
    for name, module in trunk.named_modules():
        if type(module) in classes and id(module) not in inside and id(module) not in chosen:
            found.append((name, module))
            inside.update(id(x) for x in module.modules())
    return found


def _size_units(model: nn.Module, threshold: int) -> list[tuple[str, nn.Module]]:
    """Bottom-up: a module whose parameters outside already chosen units reach
    ``threshold`` becomes a unit (the root is never one: it is the last unit anyway)."""
    found: list[tuple[str, nn.Module]] = []

    def visit(name: str, module: nn.Module) -> int:
        # parameters of this module not inside a chosen descendant
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child_name, child in module.named_children():
            remaining += visit(f"{name}.{child_name}" if name else child_name, child)
        if name and remaining >= threshold:
            found.append((name, module))
            return 0
        return remaining

    visit("", model)
    return found


def sharding_units(model: nn.Module, settings: FSDPSettings) -> list[tuple[str, nn.Module]]:
    """The modules sharded as units before the root, inner ones first, by name.

    See the module docstring for the policy. Modules without parameters are left out.
    """
    units: list[tuple[str, nn.Module]] = []
    if settings.auto_wrap_threshold > 0:
        units.extend(_size_units(model, settings.auto_wrap_threshold))
    if settings.wrap_modules:
        wanted = set(settings.wrap_modules)
        units.extend((n, m) for n, m in model.named_modules() if n and type(m).__name__ in wanted)
    if not units:
        trunk = getattr(model, "trunk", None)
        if isinstance(trunk, nn.Module):
            units.extend((f"trunk.{n}", m) for n, m in _block_units(trunk))
        heads = getattr(model, "heads", None)
        if isinstance(heads, nn.ModuleList):
            units.extend((f"heads.{i}", h) for i, h in enumerate(heads))
    # unique, with parameters, the innermost first (fully_shard is applied bottom-up)
    seen: set[int] = set()
    unique = []
    for name, module in units:
        if id(module) not in seen and _param_count(module) > 0:
            seen.add(id(module))
            unique.append((name, module))
    unique.sort(key=lambda item: -item[0].count("."))
    return unique


def _cuda_sync(*_: Any) -> None:
    torch.cuda.synchronize()


def shard_module(
    model: nn.Module,
    settings: FSDPSettings,
    mesh: Any,
    reshard_root: bool | None = None,
) -> list[str]:
    """Apply ``fully_shard`` to ``model``'s units, then to ``model`` itself, in place.

    Args:
        model: the model (or a momentum copy of it).
        settings: from :class:`FSDPSettings`.
        mesh: a 1-D ``DeviceMesh`` of every rank.
        reshard_root: ``reshard_after_forward`` of the root unit. None: FSDP2's default
            (kept gathered between forward and backward). A copy that never runs
            backward (a teacher) passes True, so its parameters are sharded again after
            each forward.

    Returns:
        The names of the units (the root last, as ``""``).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if settings.param_dtype is not None or settings.reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=settings.param_dtype, reduce_dtype=settings.reduce_dtype
        )
    if settings.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    units = sharding_units(model, settings)
    if settings.param_dtype is not None:
        # BatchNorm computes in float32 (its running statistics are float32 buffers):
        # its own unit, gathered in float32, its output cast back to the compute dtype
        norm_policy = MixedPrecisionPolicy(
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
            output_dtype=settings.param_dtype,
        )
        norm_kwargs = {**kwargs, "mp_policy": norm_policy}
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._NormBase) and _param_count(module):
                fully_shard(
                    module, reshard_after_forward=settings.reshard_after_forward, **norm_kwargs
                )
    for _, module in units:
        fully_shard(module, reshard_after_forward=settings.reshard_after_forward, **kwargs)
        if settings.force_sync_cuda:
            module.register_forward_pre_hook(_cuda_sync)
            module.register_forward_hook(_cuda_sync)
    root_kwargs = dict(kwargs)
    if reshard_root is not None:
        root_kwargs["reshard_after_forward"] = reshard_root
    fully_shard(model, **root_kwargs)
    return [name for name, _ in units] + [""]


def device_mesh(device: torch.device, world_size: int | None = None) -> Any:
    """A 1-D mesh of every rank on ``device``'s type."""
    from torch.distributed.device_mesh import init_device_mesh

    size = get_world_size() if world_size is None else world_size
    return init_device_mesh(device.type, (size,))


def shard_task_model(
    model: nn.Module,
    copies: Sequence[nn.Module],
    fsdp_config: Mapping[str, Any],
    device: torch.device,
    followers: Sequence[nn.Module] = (),
) -> FSDPSettings:
    """Shard ``model`` and its momentum ``copies`` (collective).

    Rank 0's parameters and buffers are broadcast first (what DDP's constructor does):
    every rank seeds differently, and ``fully_shard`` keeps each rank's own slice.

    Args:
        model: the model.
        copies: momentum copies whose state is the same on every rank already (a loss's,
            broadcast with the loss state).
        fsdp_config: ``MODEL.FSDP_CONFIG``.
        device: the device the model is on.
        followers: momentum copies of ``model`` made before the broadcast (the
            ``HOOKS.EMA_MODEL`` average): reset to the broadcast model, then sharded like
            ``copies``.
    """
    from vissl.models.momentum import reset_momentum_copy_

    settings = FSDPSettings.from_config(fsdp_config, device)
    for note in fairscale_notes(fsdp_config):
        logger.info(note)
    broadcast_coalesced([t.data for t in (*model.parameters(), *model.buffers())], src=0)
    for follower in followers:
        reset_momentum_copy_(follower, model)
    mesh = device_mesh(device)
    units = shard_module(model, settings, mesh)
    copies = [*copies, *followers]
    for copy in copies:
        shard_module(copy, settings, mesh, reshard_root=True)
    if settings.verbose:
        logger.info(
            "FSDP: %d units over %d ranks (%s), %d momentum copies sharded alike; mixed "
            "precision %s/%s, reshard after forward %s, CPU offload %s",
            len(units),
            get_world_size(),
            ", ".join(n or "<root>" for n in units),
            len(copies),
            settings.param_dtype,
            settings.reduce_dtype,
            settings.reshard_after_forward,
            settings.cpu_offload,
        )
    return settings


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, else ``tensor`` itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class FSDPReduction(NoReduction):
    """Gradients are reduce-scattered by FSDP2 during backward; the model is sharded by
    :func:`shard_task_model` before the optimizer is built, so :meth:`wrap` returns it.

    Buffers (BatchNorm statistics) are not sharded: with ``broadcast_buffers`` rank 0's
    are broadcast before each optimizer step's first forward, as DDP does.
    """

    name = "fsdp"

    def __init__(self, broadcast_buffers: bool = True) -> None:
        self.broadcast_buffers = broadcast_buffers
        self._buffers_synced = False

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        return model

    @contextlib.contextmanager
    def _context(self, model: nn.Module) -> Iterator[None]:
        if self.broadcast_buffers and not self._buffers_synced:
            buffers = [b for b in model.buffers() if b.numel()]
            broadcast_coalesced(buffers, src=0)
            self._buffers_synced = True
        yield

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self._context(model)

    def after_backward(self, model: nn.Module) -> None:
        self._buffers_synced = False
