"""``lr_decay``: layer-wise learning-rate decay, as BEiT fine-tunes (https://arxiv.org/abs/2106.08254).

Each trainable parameter gets a depth ``d`` and learns at the schedule's rate times
``decay ** (L + 1 - d)`` (``decay``: ``OPTIMIZER.layer_wise_lr_decay.decay``), so the
heads learn at the schedule's rate and every layer below at ``decay`` times the rate of
the layer above. VISSL's depths:

- ``vision_transformer`` (``L`` = ``MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS``): 0 for
  ``patch_embed``, ``pos_embed``, ``cls_token``, ``register_tokens`` and the mask token
  ``masked_embed`` (DINOv2's rule); ``i + 1`` for ``blocks.i``; ``L`` for
  the rest of the trunk (its last norm), or ``L + 1`` with
  ``layer_wise_lr_decay.final_norm_with_heads`` (BEiT's, MAE's and DINOv2's rule: the
  final norm learns at the heads' rate); ``L + 1`` for the heads;
- ``resnet`` (``L`` = 4 stages): 0 for the stem (``conv1``, ``bn1``); ``s`` for
  ``layer<s>``; 5 for the heads.

``layer_wise_lr_decay.patch_embed_lr_mult`` (DINOv2's ``optim.patch_embed_lr_mult``, 0.2 in
its recipes; 1 by default) multiplies the rate of the ViT's ``patch_embed`` parameters on
top of their depth's scale, as DINOv2's ``get_params_groups_with_decay``.

Weight decay: for the ViT, DINO's rule (biases and ``norm`` parameters get none), as in
VISSL; for the ResNet, biases follow ``regularize_bias`` and normalisation layers
``regularize_bn`` (VISSL picked the latter by the names ``bn<k>``, which missed the
BatchNorm of the ``downsample`` branches). ``non_regularized_parameters`` applies to both
(VISSL's ``lr_decay`` ignored it). The regularized groups follow the
``param_schedulers.weight_decay`` schedule when there is one. Every group follows
``param_schedulers.lr``; ``head_optimizer_params`` is not used (as in VISSL).

One group per (depth, regularized), named ``layer<d>_regularized`` /
``layer<d>_unregularized`` and ordered from the top (the heads) down; the patch embedding
has groups of its own (``layer0_patch_embed_regularized`` / ``..._unregularized``) when
``patch_embed_lr_mult`` is not 1.
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
_VIT_PATCH_EMBED = "patch_embed"
_VIT_BLOCK = re.compile(r"blocks\.([0-9]+)\.")
_RESNET_STEM = ("_feature_blocks.conv1", "_feature_blocks.bn1")
_RESNET_STAGE = re.compile(r"\.layer([0-9]+)\.")


def vit_param_depth(name: str, num_layers: int, final_norm_with_heads: bool = False) -> int:
    """The depth of a ``vision_transformer`` model's parameter ``name`` (module docstring).

    Args:
        final_norm_with_heads: the trunk's parameters outside the embeddings and the blocks
            (its final norm) at depth ``L + 1`` with the heads (BEiT, MAE, DINOv2), not at
            ``L`` (VISSL).
    """
    if is_head_parameter(name):
        return num_layers + 1
    if any(part in name for part in _VIT_EMBEDDINGS):
        return 0
    match = _VIT_BLOCK.search(name)
    if match is None:
        return num_layers + 1 if final_norm_with_heads else num_layers
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
    lr_mult_of: Callable[[str], tuple[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """Group ``model``'s trainable parameters by (depth, regularized[, extra factor]).

    Args:
        depth_of: parameter name -> depth in ``[0, num_layers + 1]``.
        regularized: ``(full name, owning module, local name) -> bool``.
        num_layers: ``L``; the scale is ``decay ** (L + 1 - depth)``.
        decay: the per-layer factor.
        weight_decay: the regularized groups' weight decay.
        lr_mult_of: parameter name -> (a tag for the group name, or "", an extra factor
            on its scale); default: no extra factor.
    """
    buckets: dict[tuple[int, bool, str, float], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for local, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            name = f"{module_name}.{local}" if module_name else local
            tag, mult = lr_mult_of(name) if lr_mult_of is not None else ("", 1.0)
            key = (depth_of(name), regularized(name, module, local), tag, mult)
            buckets.setdefault(key, []).append(param)
    groups = []
    for key in sorted(buckets, key=lambda k: (-k[0], k[2], not k[1])):
        depth, reg, tag, mult = key
        prefix = f"layer{depth}_{tag}_" if tag else f"layer{depth}_"
        groups.append(
            {
                "params": buckets[key],
                "weight_decay": weight_decay if reg else 0.0,
                "param_group_name": f"{prefix}{'regularized' if reg else 'unregularized'}",
                "lr_scale": float(decay ** (num_layers + 1 - depth)) * mult,
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
    section_path = f"{_PATH}.layer_wise_lr_decay"
    patch_mult = get_number(
        section, "patch_embed_lr_mult", section_path, default=1.0, min_value=0.0
    )
    final_norm_with_heads = get_bool(section, "final_norm_with_heads", section_path)
    weight_decay = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    non_regularized = non_regularized_substrings(optimizer_config)
    trunk = get_section(_model_section(model_config), "TRUNK", "config.MODEL")
    trunk_name = trunk.get("NAME")
    if trunk_name == "vision_transformer":
        vit = get_section(trunk, "VISION_TRANSFORMERS", "config.MODEL.TRUNK")
        num_layers = int(vit.get("NUM_LAYERS", 12))

        def vit_regularized(name: str, module: nn.Module, local: str) -> bool:
            return dino_regularized(name) and not any(s in name for s in non_regularized)

        def patch_embed_mult(name: str) -> tuple[str, float]:
            if patch_mult != 1.0 and _VIT_PATCH_EMBED in name and not is_head_parameter(name):
                return _VIT_PATCH_EMBED, float(patch_mult)
            return "", 1.0

        return layer_decay_groups(
            model,
            depth_of=lambda name: vit_param_depth(name, num_layers, final_norm_with_heads),
            regularized=vit_regularized,
            num_layers=num_layers,
            decay=decay,
            weight_decay=weight_decay,
            lr_mult_of=patch_embed_mult,
        )
    for key, value, default in (
        ("patch_embed_lr_mult", patch_mult, 1.0),
        ("final_norm_with_heads", final_norm_with_heads, False),
    ):
        if value != default:
            raise ConfigError(
                f"{section_path}.{key}={value!r} applies to the vision_transformer trunk only "
                f"(its patch_embed / final norm), not config.MODEL.TRUNK.NAME="
                f"{trunk_name!r}: remove it (or set it to {default}).",
                f"{section_path}.{key}",
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
