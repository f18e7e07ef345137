"""The ViT pretraining recipes build their trunk and their optimizer groups as the authors'
code does.

- Trunk: MAE's, I-JEPA's and MoCo v3's recipes use the fixed 2-D sin-cos position
  embedding and their authors' initialisation (POS_EMBED, INIT).
- Weight decay: per recipe, the set of decayed parameters is the reference's rule applied
  to our model's parameter names and shapes. The rules, read from each repository:

  ======  ==========================================================  =====================
  recipe  no weight decay for                                         where
  ======  ==========================================================  =====================
  DINO    names ending in ``.bias``, 1-D parameters                   dino utils.py::get_params_groups
  iBOT    the same                                                    ibot utils.py::get_params_groups
  DINOv2  names ending in ``.bias``, containing ``norm`` or ``gamma``  dinov2 utils/param_groups.py
  MSN     names containing ``bias`` or ``bn``, 1-D, the prototypes    msn src/msn_train.py::init_opt
  I-JEPA  names containing ``bias``, 1-D                              ijepa src/helper.py::init_opt
  MAE     1-D parameters, names ending in ``.bias``                   timm add_weight_decay (main_pretrain.py)
  ======  ==========================================================  =====================

  Frozen parameters (MAE's and I-JEPA's sin-cos ``pos_embed``) are in no group.
- Learning rates (DINOv2, the only recipe with layer-wise decay): DINOv2's
  ``get_vit_lr_decay_rate`` with ``patch_embed_lr_mult`` 0.2.

The models are built on the meta device (no memory, no init cost) where they can be.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.models import build_model
from vissl.models.trunks import get_model_trunk
from vissl.optimizers.param_groups import get_param_group_constructor
from vissl.utils.hydra_config import hydra_compose_and_validate

Rule = Callable[[str, torch.Tensor], bool]  # (our parameter name, parameter) -> decayed


def _dino_rule(name: str, p: torch.Tensor) -> bool:
    return not (name.endswith(".bias") or p.ndim == 1)


def _dinov2_rule(name: str, p: torch.Tensor) -> bool:
    return not (name.endswith(".bias") or "norm" in name or "gamma" in name)


def _msn_rule(name: str, p: torch.Tensor) -> bool:
    if name == "heads.0.prototypes":  # init_opt's own group, weight_decay 0
        return False
    return not ("bias" in name or "bn" in name or p.ndim == 1)


def _ijepa_rule(name: str, p: torch.Tensor) -> bool:
    return not ("bias" in name or p.ndim == 1)


def _mae_rule(name: str, p: torch.Tensor) -> bool:
    return not (p.ndim == 1 or name.endswith(".bias"))


RULES: dict[str, Rule] = {
    "dino/dino_8gpu_vits16": _dino_rule,
    "dino/dino_64gpu_vits16": _dino_rule,
    "ibot/ibot_8gpu_vits16": _dino_rule,
    "ibot/ibot_8gpu_vitb16": _dino_rule,
    "dinov2/dinov2_8gpu_vits16": _dinov2_rule,
    "dinov2/dinov2_8gpu_vitb16": _dinov2_rule,
    "msn/msn_8gpu_vits16": _msn_rule,
    "msn/msn_8gpu_vitb16": _msn_rule,
    "mae/mae_8gpu_vits16": _mae_rule,
    "mae/mae_8gpu_vitb16": _mae_rule,
    "ijepa/ijepa_8gpu_vits16": _ijepa_rule,
    "ijepa/ijepa_8gpu_vitb16": _ijepa_rule,
}


@functools.cache
def _config(name: str) -> AttrDict:
    _, cfg = hydra_compose_and_validate([f"config=pretrain/{name}"])
    return cfg


def _model(name: str) -> nn.Module:
    cfg = _config(name)
    try:
        with torch.device("meta"):
            return build_model(cfg.MODEL, cfg.OPTIMIZER)
    except NotImplementedError:  # a head that computes on real tensors at build time
        torch.manual_seed(0)
        return build_model(cfg.MODEL, cfg.OPTIMIZER)


def _groups(name: str, model: nn.Module) -> list[dict]:
    cfg = _config(name)
    constructor = cfg.OPTIMIZER.get("param_group_constructor", "default")
    return get_param_group_constructor(constructor)(model, cfg.MODEL, cfg.OPTIMIZER)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n == "ijepa/ijepa_8gpu_vitb16" else n
        for n in sorted(RULES)
    ],
)
def test_decayed_parameters_are_the_references(name: str) -> None:
    model = _model(name)
    groups = _groups(name, model)
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    grouped = {id(p) for g in groups for p in g["params"]}
    rule = RULES[name]
    wrong = []
    for pname, param in model.named_parameters():
        if not param.requires_grad:
            assert id(param) not in grouped, pname
            continue
        if (id(param) in decayed) != rule(pname, param):
            wrong.append(pname)
    assert wrong == [], f"{name}: decayed against the reference's rule: {wrong}"
    # the embeddings and tokens are decayed where they are trained, as in every reference
    params = dict(model.named_parameters())
    for token in ("trunk.cls_token", "trunk.register_tokens", "trunk.patch_masking.masked_embed"):
        if token in params:
            assert id(params[token]) in decayed, token
    if params["trunk.pos_embed"].requires_grad:
        assert id(params["trunk.pos_embed"]) in decayed


@pytest.mark.parametrize("name", ["dinov2/dinov2_8gpu_vits16", "dinov2/dinov2_8gpu_vitb16"])
def test_dinov2_learning_rate_scales_are_dinov2s(name: str) -> None:
    """dinov2 get_vit_lr_decay_rate (layerwise_decay 0.9) times patch_embed_lr_mult 0.2."""
    model = _model(name)
    layers = len(model.trunk.blocks)
    scale_of = {id(p): g["lr_scale"] for g in _groups(name, model) for p in g["params"]}
    for pname, param in model.named_parameters():
        layer_id = layers + 1
        if pname.startswith("trunk."):
            local = pname.removeprefix("trunk.")
            if any(
                e in local for e in ("pos_embed", "patch_embed", "mask", "cls_token", "register")
            ):
                layer_id = 0
            elif local.startswith("blocks."):
                layer_id = int(local.split(".")[1]) + 1
        want = 0.9 ** (layers + 1 - layer_id) * (0.2 if "patch_embed" in pname else 1.0)
        assert scale_of[id(param)] == pytest.approx(want, rel=1e-12), pname
    assert scale_of[id(model.trunk.norm.weight)] == 1.0


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("mae/mae_8gpu_vits16", "mae"),
        ("mae/mae_8gpu_vitb16", "mae"),
        ("ijepa/ijepa_8gpu_vits16", "ijepa"),
        ("ijepa/ijepa_8gpu_vitb16", "ijepa"),
        ("moco_v3/moco_v3_8gpu_vits16", "moco_v3"),
        ("moco_v3/moco_v3_64gpu_vits16", "moco_v3"),
    ],
)
def test_sincos_recipes_turn_on_the_authors_trunk(name: str, init: str) -> None:
    vit = _config(name).MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.POS_EMBED, vit.INIT) == ("sincos", init)
    with torch.device("meta"):
        trunk = get_model_trunk("vision_transformer")(_config(name).MODEL, "vision_transformer")
    assert trunk.pos_embed.requires_grad is False


@pytest.mark.parametrize(
    "name",
    [
        "dino/dino_8gpu_vits16",
        "ibot/ibot_8gpu_vits16",
        "dinov2/dinov2_8gpu_vits16",
        "msn/msn_8gpu_vits16",
    ],
)
def test_learned_position_embedding_recipes_keep_dinos_trunk(name: str) -> None:
    """DINO, iBOT, DINOv2 and MSN train their position embedding (trunc-normal init)."""
    vit = _config(name).MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.POS_EMBED, vit.INIT) == ("learned", "default")
