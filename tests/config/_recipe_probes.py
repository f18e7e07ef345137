"""How ``tests/config/test_recipe_cards.py`` reads a card field from our configs.

A :class:`Recipe` is one composed config (``hydra_compose_and_validate``, composed once per
test process through :func:`recipe`) with what the card fields need built lazily from it:
the param schedulers (as the trainer builds them, auto-scaling included), and the heads
(``MODEL.HEAD.PARAMS`` only, no trunk). :data:`PROBES` maps a card field to the function
that reads our value; a field that is not in :data:`PROBES` is a dotted config key under
``config`` (``LOSS.dino_loss.teacher_temp``).

Values are returned in the notation of the cards (:mod:`tests.config.recipe_cards`), so a
failure prints both sides the same way.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.config.recipe_cards import Sched
from vissl.models.base_ssl_model import parse_head_params
from vissl.models.heads import get_model_head
from vissl.optimizers.param_scheduler import build_param_schedulers
from vissl.optimizers.param_scheduler.scheduler_set import MAX_WHERE
from vissl.utils.hydra_config import hydra_compose_and_validate

IMAGENET_TRAIN_IMAGES = 1281167
#: composed without data: the recipes name ImageNet folders that are not on this machine
NO_DATA = [
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATA_PATHS=[]",
    "config.DATA.TRAIN.LABEL_SOURCES=[]",
    "config.DATA.TRAIN.LABEL_PATHS=[]",
]


class Recipe:
    """One composed pretraining config and what the card fields read from it."""

    def __init__(self, name: str, overrides: tuple[str, ...] = ()) -> None:
        self.name = name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, self.cfg = hydra_compose_and_validate([f"config={name}", *overrides, *NO_DATA])

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        return int(self.cfg.DISTRIBUTED.NUM_NODES) * int(self.cfg.DISTRIBUTED.NUM_PROC_PER_NODE)

    @property
    def global_batch(self) -> int:
        """Images per optimizer step (gradient accumulation included)."""
        steps = int(self.cfg.OPTIMIZER.get("GRAD_ACCUMULATION_STEPS", 1) or 1)
        return int(self.cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * self.world_size * steps

    @property
    def epochs(self) -> int:
        return int(self.cfg.OPTIMIZER.num_epochs)

    # ------------------------------------------------------------------ schedules
    @functools.cached_property
    def schedules(self) -> Any:
        return build_param_schedulers(
            self.cfg.OPTIMIZER,
            batch_size_per_replica=int(self.cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
            world_size=self.world_size,
            num_nodes=int(self.cfg.DISTRIBUTED.NUM_NODES),
        )

    def curve(self, name: str) -> list[float]:
        """The schedule ``name`` at the start of every epoch (and at the end of the run)."""
        return self._curve(name)

    @functools.cache  # noqa: B019 (one Recipe per config per process)
    def _curve(self, name: str) -> list[float]:
        sched = self.schedules.scheduler(name)
        n = self.epochs
        return [float(sched(min(e / n, MAX_WHERE))) for e in range(n)] + [float(sched(MAX_WHERE))]

    # ------------------------------------------------------------------ heads
    @functools.cached_property
    def parallel_heads(self) -> bool:
        return parse_head_params(self.cfg.MODEL.HEAD.get("PARAMS", []))[1]

    @functools.cached_property
    def heads(self) -> list[nn.Module]:
        """The heads of ``MODEL.HEAD.PARAMS``, each chain as one ``nn.Sequential``."""
        chains, _ = parse_head_params(self.cfg.MODEL.HEAD.get("PARAMS", []))
        heads = []
        for chain in chains:
            modules = []
            for head_name, kwargs in chain:
                cls = get_model_head(head_name)
                try:
                    with _meta_device():
                        modules.append(cls(self.cfg.MODEL, **kwargs))
                except (NotImplementedError, RuntimeError):  # an init that reads values
                    modules.append(cls(self.cfg.MODEL, **kwargs))
            heads.append(modules[0] if len(modules) == 1 else nn.Sequential(*modules))
        return heads


@contextlib.contextmanager
def _meta_device():
    """Build on the meta device: the layout without allocating 65536-way prototypes."""
    with torch.device("meta"):
        yield


@functools.cache
def recipe(name: str, overrides: tuple[str, ...] = ()) -> Recipe:
    """The composed config ``name`` (with ``overrides``), composed once per test process."""
    return Recipe(name, overrides)


# ---------------------------------------------------------------------- field readers
def config_value(r: Recipe, key: str) -> Any:
    """The value at the dotted key ``key`` under ``config`` (lists as tuples)."""
    node: Any = r.cfg
    for part in key.split("."):
        if isinstance(node, (list, tuple)):
            node = node[int(part)]
        else:
            node = node[part]
    return _plain(node)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    return value


def optimizer(r: Recipe) -> str:
    """``sgd``, ``lars``, ``larc`` (VISSL's LARC around SGD), ``adamw``, ..."""
    name = str(r.cfg.OPTIMIZER.name)
    if name == "sgd" and r.cfg.OPTIMIZER.use_larc:
        return "larc (clip)" if r.cfg.OPTIMIZER.larc_config.clip else "larc"
    return name


def lr_peak(r: Recipe) -> float:
    return max(r.curve("lr"))


def warmup_epochs(r: Recipe) -> int:
    curve = r.curve("lr")[:-1]
    peak = max(curve)
    return next(e for e, v in enumerate(curve) if v >= peak * (1 - 1e-9))


def warmup_start(r: Recipe) -> float:
    """The learning rate of the first step, as a fraction of the peak."""
    return r.curve("lr")[0] / lr_peak(r) if warmup_epochs(r) else 1.0


def lr_schedule(r: Recipe) -> Sched:
    """The schedule after the warm-up: cosine / steps / constant, and where it ends."""
    warm = warmup_epochs(r)
    return describe(r.curve("lr")[warm:], r.epochs - warm, offset=warm)


def describe(curve: list[float], n: int, offset: int = 0) -> Sched:
    """``curve`` (values at ``n`` epoch starts and at the end) as a :class:`Sched`."""
    start, end = curve[0], curve[-1]
    values = curve[:-1]
    if all(math.isclose(v, start, rel_tol=1e-9, abs_tol=1e-15) for v in curve):
        return Sched("constant", start=start, end=end)
    cosine = [end + (start - end) * 0.5 * (1 + math.cos(math.pi * e / n)) for e in range(n)]
    scale = max(abs(start), abs(end))
    if all(abs(v - c) <= 1e-3 * scale for v, c in zip(values, cosine, strict=True)):
        return Sched("cosine", start=start, end=end)
    linear = [start + (end - start) * e / n for e in range(n)]
    if all(abs(v - c) <= 1e-3 * scale for v, c in zip(values, linear, strict=True)):
        return Sched("linear", start=start, end=end)
    drops = [e for e in range(1, n) if not math.isclose(values[e], values[e - 1], rel_tol=1e-9)]
    if drops and len(drops) <= 5:
        return Sched(
            "steps",
            start=start,
            end=values[-1],
            milestones=tuple(offset + e for e in drops),
            gamma=round(values[drops[0]] / values[drops[0] - 1], 6),
        )
    return Sched("other", start=start, end=end)


def weight_decay(r: Recipe) -> float | Sched:
    """A number, or the ``param_schedulers.weight_decay`` schedule."""
    if r.schedules.has_weight_decay:
        return describe(r.curve("weight_decay"), r.epochs)
    return float(r.cfg.OPTIMIZER.weight_decay)


def wd_exempt(r: Recipe) -> tuple[str, ...]:
    """What gets no weight decay: ``norm`` layers, ``bias`` es, and named parameters."""
    opt = r.cfg.OPTIMIZER
    exempt: set[str] = set()
    if opt.name == "lars" and opt.get("exclude_bias_and_norm", False):
        exempt |= {"norm", "bias"}
    constructor = str(opt.get("param_group_constructor", "default"))
    vit = str(r.cfg.MODEL.TRUNK.NAME) == "vision_transformer"
    if constructor == "dino" or (constructor == "lr_decay" and vit):
        # DINO's rule (vissl/optimizers/param_groups/dino.py, layer_decay.py)
        exempt |= {"bias", "norm"}
        exempt |= {str(p) for p in opt.get("non_regularized_parameters", []) or []}
    elif not opt.get("construct_single_param_group_only", False):
        if not opt.regularize_bn:
            exempt.add("norm")
        if not opt.regularize_bias:
            exempt.add("bias")
        exempt |= {str(p) for p in opt.get("non_regularized_parameters", []) or []}
    # names that pick BatchNorm / norm layers out are the ``norm`` category (MSN's ``fc.bn``)
    named_norms = {e for e in exempt if e not in ("norm", "bias") and ("bn" in e or "norm" in e)}
    if named_norms:
        exempt = (exempt - named_norms) | {"norm"}
    # a frozen (sin-cos) position embedding gets no update: its weight decay is moot
    if "pos_embed" in exempt and pos_embed(r) != "learned":
        exempt.discard("pos_embed")
    return tuple(sorted(exempt))


def lr_head_schedule(r: Recipe) -> Sched:
    """The heads' lr schedule (``lr_head``; the trunk's ``lr`` when not set)."""
    curve = r.curve("lr_head")
    warm = warmup_epochs(r) if curve == r.curve("lr") else 0
    return describe(curve[warm:], r.epochs - warm)


def transforms(r: Recipe) -> tuple[str, ...]:
    """The names of the training transforms, in order."""
    return tuple(str(t["name"]) for t in r.cfg.DATA.TRAIN.TRANSFORMS)


def pos_embed(r: Recipe) -> str:
    """``learned`` or the fixed embedding a ViT trunk is configured with."""
    vit = r.cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    for key in ("POS_EMBED", "POSITION_EMBEDDING", "POS_EMBED_TYPE"):
        if key in vit:
            return str(vit[key])
    return "learned"


def trust_ratio_exempt(r: Recipe) -> tuple[str, ...]:
    """Parameters that LARS / LARC leaves without the layer-wise trust ratio."""
    opt = r.cfg.OPTIMIZER
    if opt.name == "lars" and opt.get("exclude_bias_and_norm", False):
        return ("bias", "norm")
    return ()


def trust_coefficient(r: Recipe) -> float | None:
    opt = r.cfg.OPTIMIZER
    if opt.name == "lars":
        return float(opt.eta)
    if opt.name == "sgd" and opt.use_larc:
        return float(opt.larc_config.trust_coefficient)
    return None


def batch_size(r: Recipe) -> int:
    return r.global_batch


def epochs(r: Recipe) -> int:
    return r.epochs


def crops(r: Recipe) -> tuple[tuple[int, int, tuple[float, float]], ...]:
    """``((number, size, (min scale, max scale)), ...)`` of the training crops."""
    transforms = list(r.cfg.DATA.TRAIN.TRANSFORMS)
    names = [t["name"] for t in transforms]
    if "ImgPilToMultiCrop" in names:
        t = transforms[names.index("ImgPilToMultiCrop")]
        return tuple(
            (int(n), int(s), (float(sc[0]), float(sc[1])))
            for n, s, sc in zip(t["num_crops"], t["size_crops"], t["crop_scales"], strict=True)
        )
    copies = 1
    if "ImgReplicatePil" in names:
        copies = int(transforms[names.index("ImgReplicatePil")].get("num_times", 2))
    for name in ("RandomResizedCrop", "ImgPilRandomResizedCrop"):
        if name in names:
            t = transforms[names.index(name)]
            lo, hi = t.get("scale", (0.08, 1.0))
            return ((copies, int(t["size"]), (float(lo), float(hi))),)
    raise AssertionError(f"{r.name}: no crop transform in {names}")


def grad_clip(r: Recipe) -> str:
    """``none``, or ``<MODE> <MAX_NORM>`` (``global``: one norm over every gradient;
    ``per_parameter``; ``per_module``), then ``excluding <names>`` for EXCLUDE_PARAMS."""
    clip = r.cfg.MODEL.GRAD_CLIP
    if not clip.USE_GRAD_CLIP:
        return "none"
    text = f"{clip.get('MODE', 'global')} {float(clip.MAX_NORM):g}"
    excluded = list(clip.get("EXCLUDE_PARAMS", []) or [])
    return text + (f" excluding {', '.join(map(str, excluded))}" if excluded else "")


def zero_init_residual(r: Recipe) -> bool:
    return bool(r.cfg.MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL)


def head(r: Recipe) -> str:
    """The layers of every head, in order: ``Linear 2048-2048, BN, ReLU, ...``; ``→`` between
    heads applied one after the other, ``|`` between parallel heads (the list-of-chains
    form of ``MODEL.HEAD.PARAMS``)."""
    return (" | " if r.parallel_heads else " → ").join(layout(h) for h in r.heads)


def layout(module: nn.Module) -> str:
    """The leaf layers of ``module`` in registration order, in the cards' notation."""
    parts = []
    for m in module.modules():
        if any(True for _ in m.children()) and not _is_leaf_like(m):
            continue
        text = _layer(m)
        if text:
            parts.append(text)
    return ", ".join(parts)


def _is_leaf_like(m: nn.Module) -> bool:
    return type(m).__name__ in ("WeightNormLinear",)


def _layer(m: nn.Module) -> str | None:
    if isinstance(m, nn.Linear) or type(m).__name__ == "WeightNormLinear":
        weight = getattr(m, "weight", None)
        if weight is None:
            weight = getattr(m, "weight_v", None)
        out_f, in_f = (int(weight.shape[0]), int(weight.shape[1])) if weight is not None else (0, 0)
        bias = getattr(m, "bias", None) is not None
        kind = (
            "WNLinear" if type(m).__name__ == "WeightNormLinear" or _weight_normed(m) else "Linear"
        )
        return f"{kind} {in_f}-{out_f}" + ("" if bias else " (no bias)")
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "BN" if m.affine else "BN (no affine)"
    if isinstance(m, nn.LayerNorm):
        return "LN"
    for act in (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid):
        if isinstance(m, act):
            return act.__name__
    if isinstance(m, nn.Dropout):
        return "Dropout" if m.p > 0 else None
    if isinstance(m, nn.Identity):
        return None
    if isinstance(m, nn.Conv2d):
        return f"Conv {m.in_channels}-{m.out_channels} k{m.kernel_size[0]}"
    if isinstance(m, nn.AdaptiveAvgPool2d):
        return "AvgPool"
    return type(m).__name__


def _weight_normed(m: nn.Module) -> bool:
    return hasattr(m, "parametrizations") or hasattr(m, "weight_g")


PROBES: dict[str, Callable[[Recipe], Any]] = {
    "optimizer": optimizer,
    "lr": lr_peak,
    # our param groups give 1-D parameters the weights' schedule
    "lr_norm_bias": lr_peak,
    "warmup_epochs": warmup_epochs,
    "warmup_start": warmup_start,
    "lr_schedule": lr_schedule,
    "weight_decay": weight_decay,
    "wd_exempt": wd_exempt,
    "trust_ratio_exempt": trust_ratio_exempt,
    "trust_coefficient": trust_coefficient,
    "batch_size": batch_size,
    "epochs": epochs,
    "crops": crops,
    "grad_clip": grad_clip,
    "lr_head_schedule": lr_head_schedule,
    "transforms": transforms,
    "pos_embed": pos_embed,
    "zero_init_residual": zero_init_residual,
    "head": head,
}


def iterations_per_epoch(r: Recipe) -> int:
    """Optimizer steps per epoch: the sampler pads to equal shards, DROP_LAST drops the rest."""
    per_rank = math.ceil(IMAGENET_TRAIN_IMAGES / r.world_size)
    steps = int(r.cfg.OPTIMIZER.get("GRAD_ACCUMULATION_STEPS", 1) or 1)
    return per_rank // int(r.cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) // steps


def read(r: Recipe, field: str) -> Any:
    """Our value of the card field ``field`` in the recipe ``r``.

    ``epochs_of:<key>`` is the iteration count at ``<key>`` in ImageNet-1k epochs of this
    config (2 decimals): the cards give the authors' epochs where our config counts steps.
    """
    probe = PROBES.get(field)
    if probe is not None:
        return probe(r)
    if field.startswith("transform:"):  # transform:<name>.<key>, the first such transform
        name, key = field[len("transform:") :].split(".", 1)
        for t in r.cfg.DATA.TRAIN.TRANSFORMS:
            if t["name"] == name:
                return _plain(t.get(key))
        return None
    if field.startswith("epochs_of:"):
        key = field[len("epochs_of:") :]
        return round(float(config_value(r, key)) / iterations_per_epoch(r), 2)
    return config_value(r, field)


__all__ = ["IMAGENET_TRAIN_IMAGES", "PROBES", "Recipe", "read", "recipe"]
