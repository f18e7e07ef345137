"""``lr_decay``: layer-wise learning-rate decay, as BEiT fine-tunes (https://arxiv.org/abs/2106.08254).

Each trainable parameter gets a depth ``d`` and learns at the schedule's rate times
``decay ** (L + 1 - d)`` (``decay``: ``OPTIMIZER.layer_wise_lr_decay.decay``), so the
heads learn at the schedule's rate and every layer below at ``decay`` times the rate of
the layer above. VISSL's depths:

- ``vision_transformer`` (``L`` = ``MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS``): 0 for
  ``patch_embed``, ``pos_embed``, ``cls_token``, ``register_tokens`` and the mask token
  ``masked_embed`` (DINOv2's rule); ``i + 1`` for ``blocks.i``; ``L`` for
  the rest of the trunk (its last norm); ``L + 1`` for the heads;
- ``resnet`` (``L`` = 4 stages): 0 for the stem (``conv1``, ``bn1``); ``s`` for
  ``layer<s>``; 5 for the heads.

Weight decay: for the ViT, DINO's rule (biases and ``norm`` parameters get none), as in
VISSL; for the ResNet, biases follow ``regularize_bias`` and normalisation layers
``regularize_bn`` (VISSL picked the latter by the names ``bn<k>``, which missed the
BatchNorm of the ``downsample`` branches). ``non_regularized_parameters`` applies to both
(VISSL's ``lr_decay`` ignored it). The regularized groups follow the
``param_schedulers.weight_decay`` schedule when there is one. Every group follows
``param_schedulers.lr``; ``head_optimizer_params`` is not used (as in VISSL).

One group per (depth, regularized), named ``layer<d>_regularized`` /
``layer<d>_unregularized`` and ordered from the top (the heads) down.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from vissl.errors import ConfigError
from vissl.optimizers._checks import get_bool, get_number, get_section
from vissl.optimizers.param_groups.default import (
    NORM_TYPES,
    is_bias,
    is_head_parameter,
    non_regularized_substrings,
)
from vissl.optimizers.param_groups.dino import dino_regularized
from vissl.optimizers.param_groups.registry import register_param_group_constructor

_PATH = "config.OPTIMIZER"
#: the trunks with a depth rule
SUPPORTED_TRUNKS = ("vision_transformer", "resnet")
#: ResNet stages
RESNET_STAGES = 4
_VIT_EMBEDDINGS = ("patch_embed", "pos_embed", "cls_token", "register_tokens", "masked_embed")
_VIT_BLOCK = re.compile(r"blocks\.([0-9]+)\.")
_RESNET_STEM = ("_feature_blocks.conv1", "_feature_blocks.bn1")
_RESNET_STAGE = re.compile(r"\.layer([0-9]+)\.")


def vit_param_depth(name: str, num_layers: int) -> int:
    """The depth of a ``vision_transformer`` model's parameter ``name`` (module docstring)."""
    if is_head_parameter(name):
        return num_layers + 1
    if any(part in name for part in _VIT_EMBEDDINGS):
        return 0
    match = _VIT_BLOCK.search(name)
    if match is None:
        return num_layers
    depth = int(match.group(1)) + 1
    if depth > num_layers:
        raise ValueError(
            f"{name}: block {depth - 1} of a ViT of "
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS={num_layers} blocks."
        )
    return depth


def resnet_param_depth(name: str, num_layers: int = RESNET_STAGES) -> int:
    """The depth of a ``resnet`` model's parameter ``name`` (module docstring)."""
    if is_head_parameter(name):
        return num_layers + 1
    if any(part in name for part in _RESNET_STEM):
        return 0
    match = _RESNET_STAGE.search(name)
    return int(match.group(1)) if match is not None else num_layers + 1


def _model_section(model_config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if model_config is None:
        raise ValueError(
            "param_group_constructor 'lr_decay' reads config.MODEL (the trunk and its depth): "
            "pass model_config to build_optimizer."
        )
    return model_config


def layer_decay_groups(
    model: nn.Module,
    *,
    depth_of: Callable[[str], int],
    regularized: Callable[[str, nn.Module, str], bool],
    num_layers: int,
    decay: float,
    weight_decay: float,
) -> list[dict[str, Any]]:
    """Group ``model``'s trainable parameters by (depth, regularized).

    Args:
        depth_of: parameter name -> depth in ``[0, num_layers + 1]``.
        regularized: ``(full name, owning module, local name) -> bool``.
        num_layers: ``L``; the scale is ``decay ** (L + 1 - depth)``.
        decay: the per-layer factor.
        weight_decay: the regularized groups' weight decay.
    """
    buckets: dict[tuple[int, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for local, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            name = f"{module_name}.{local}" if module_name else local
            key = (depth_of(name), regularized(name, module, local))
            buckets.setdefault(key, []).append(param)
    groups = []
    for depth, reg in sorted(buckets, key=lambda k: (-k[0], not k[1])):
        groups.append(
            {
                "params": buckets[(depth, reg)],
                "weight_decay": weight_decay if reg else 0.0,
                "param_group_name": f"layer{depth}_{'regularized' if reg else 'unregularized'}",
                "lr_scale": float(decay ** (num_layers + 1 - depth)),
                "weight_decay_scheduled": reg,
            }
        )
    return groups


@register_param_group_constructor("lr_decay")
def lr_decay_param_groups(
    model: nn.Module, model_config: Mapping[str, Any] | None, optimizer_config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Layer-wise learning-rate decay groups (see the module docstring).

    Raises:
        ConfigError: a trunk without a depth rule, or an invalid ``decay``.
    """
    section = get_section(optimizer_config, "layer_wise_lr_decay", _PATH)
    decay = get_number(
        section,
        "decay",
        f"{_PATH}.layer_wise_lr_decay",
        default=0.9,
        min_value=0.0,
        min_inclusive=False,
        max_value=1.0,
    )
    weight_decay = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    non_regularized = non_regularized_substrings(optimizer_config)
    trunk = get_section(_model_section(model_config), "TRUNK", "config.MODEL")
    trunk_name = trunk.get("NAME")
    if trunk_name == "vision_transformer":
        vit = get_section(trunk, "VISION_TRANSFORMERS", "config.MODEL.TRUNK")
        num_layers = int(vit.get("NUM_LAYERS", 12))

        def vit_regularized(name: str, module: nn.Module, local: str) -> bool:
            return dino_regularized(name) and not any(s in name for s in non_regularized)

        return layer_decay_groups(
            model,
            depth_of=lambda name: vit_param_depth(name, num_layers),
            regularized=vit_regularized,
            num_layers=num_layers,
            decay=decay,
            weight_decay=weight_decay,
        )
    if trunk_name == "resnet":
        regularize_bn = get_bool(optimizer_config, "regularize_bn", _PATH, default=False)
        regularize_bias = get_bool(optimizer_config, "regularize_bias", _PATH, default=True)

        def resnet_regularized(name: str, module: nn.Module, local: str) -> bool:
            if any(s in name for s in non_regularized):
                return False
            if isinstance(module, NORM_TYPES):
                return regularize_bn and (regularize_bias or not is_bias(local))
            return regularize_bias or not is_bias(local)

        return layer_decay_groups(
            model,
            depth_of=resnet_param_depth,
            regularized=resnet_regularized,
            num_layers=RESNET_STAGES,
            decay=decay,
            weight_decay=weight_decay,
        )
    raise ConfigError(
        f"{_PATH}.param_group_constructor 'lr_decay' has depth rules for the trunks "
        f"{list(SUPPORTED_TRUNKS)}, not config.MODEL.TRUNK.NAME={trunk_name!r} (as in VISSL); "
        "use param_group_constructor 'default' for it.",
        f"{_PATH}.param_group_constructor",
    )
