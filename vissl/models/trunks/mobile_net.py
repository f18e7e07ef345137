"""Trunks ``mobilenetv3_timm`` (alias ``mobilenetv3``) and ``mobilenetv3_tv``: VISSL's
MobileNet-V3 trunks, timm's and torchvision's models.

Configured by MODEL.TRUNK.MOBILE_NET, VISSL's keys:

- ``NAME`` (``mobilenetv3_large_100``): the model. VISSL builds only this one; vissl
  also takes timm's other MobileNet-V3 names for ``mobilenetv3_timm``
  (``mobilenetv3_small_050``, ``mobilenetv3_large_075``, ...) and
  ``mobilenetv3_small_100`` for ``mobilenetv3_tv`` (torchvision's small model).
- ``PRETRAINED`` (False): must stay False; vissl downloads nothing. Load weights with
  MODEL.WEIGHTS_INIT (e.g. a file in VISSL's ``model.<name>`` layout).
- ``TIMM_BN`` (False, ``mobilenetv3_tv`` only): BatchNorm eps 1e-5 and momentum 0.1, the
  settings timm trains with, instead of torchvision's 1e-3 and 0.01.
- ``TRUNK_ONLY`` (True, ``mobilenetv3_timm`` only): drop timm's 1x1 ``conv_head``, so
  the default output is the pooled last feature map (960 channels for the large model)
  instead of the 1280-wide head feature.

The model is the submodule ``model``, as in VISSL, so the state-dict names are VISSL's
(``model.<timm name>`` / ``model.features.<i>.*``) and VISSL's MobileNet checkpoints load
unchanged. The classifier is not part of the trunk.

Features (``out_feat_keys``), VISSL's names:

=================  ======================================================  ===========
name               what                                                    trunks
=================  ======================================================  ===========
trunk              the last feature map (``forward_features``)            both
trunk_pool         ``trunk`` average-pooled and flattened                  both
trunk_pool_norm    ``trunk_pool`` L2-normalised                            both
flatten            timm's pooled head feature (``forward_head``,           timm
                   ``pre_logits``): conv_head unless TRUNK_ONLY, Hardswish
flatten_norm       ``flatten`` L2-normalised                               timm
stage{i}           output of ``model.blocks[i]``, the i-th stage            timm
=================  ======================================================  ===========

The default output is ``trunk_pool`` (``mobilenetv3_tv``, and ``mobilenetv3_timm`` with
TRUNK_ONLY) or ``flatten`` (``mobilenetv3_timm`` without TRUNK_ONLY), as in VISSL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.errors import ConfigError
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    checkpointing_on,
    import_timm,
    maybe_checkpoint,
    parse_trunk,
    resolve_features,
    trunk_error,
)

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class MobileNetParams:
    """``config.MODEL.TRUNK.MOBILE_NET`` (VISSL's keys and defaults; PRETRAINED and
    TRUNK_ONLY are read with defaults by VISSL's trunks).

    NAME is checked by each trunk (timm's or torchvision's names); PRETRAINED must be
    False: vissl downloads no weights.
    """

    NAME: str = "mobilenetv3_large_100"
    TIMM_BN: bool = False
    PRETRAINED: bool = False
    TRUNK_ONLY: bool = True

    def check(self, key_path: str) -> None:
        if self.PRETRAINED:
            raise trunk_error(
                "MOBILE_NET",
                "PRETRAINED",
                self.PRETRAINED,
                "vissl downloads no weights; set it to False and load them with "
                "config.MODEL.WEIGHTS_INIT.PARAMS_FILE (a VISSL MobileNet checkpoint, or a "
                "state dict with the trunk's model.* names).",
            )


#: NAME -> torchvision builder for mobilenetv3_tv.
TORCHVISION_NAMES = {
    "mobilenetv3_large_100": "mobilenet_v3_large",
    "mobilenetv3_small_100": "mobilenet_v3_small",
}


def _pool(feat: torch.Tensor) -> torch.Tensor:
    return torch.flatten(F.adaptive_avg_pool2d(feat, 1), 1)


@register_model_trunk("mobilenetv3")
@register_model_trunk("mobilenetv3_timm")
class MobileNetV3Timm(nn.Module):
    """timm's MobileNet-V3 with VISSL's feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.MOBILE_NET, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (each stage).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad MOBILE_NET value (naming its key), or timm is missing.
    """

    def __init__(
        self, model_config: Mapping[str, Any], model_name: str = "mobilenetv3_timm"
    ) -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(MobileNetParams, model_config, "MOBILE_NET")
        timm = import_timm("mobilenetv3_timm")
        name = p.NAME
        names = [n for n in timm.list_models("mobilenetv3_*") if not n.startswith("tf_")]
        if name not in names:
            raise trunk_error(
                "MOBILE_NET", "NAME", name, f"must be a timm MobileNet-V3 name, one of {names}."
            )
        self.trunk_only = p.TRUNK_ONLY
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        self.model = timm.create_model(
            name, pretrained=False, num_classes=0, in_chans=input_channels(self.input_type)
        )
        if self.trunk_only:
            self.model.conv_head = nn.Identity()
        width = int(self.model.num_features)
        self.output_dim = width if self.trunk_only else int(self.model.head_hidden_size)
        self.default_feature = "trunk_pool" if self.trunk_only else "flatten"
        stages = [f"stage{i}" for i in range(len(self.model.blocks))]
        self.feature_names = [
            "trunk",
            "trunk_pool",
            "trunk_pool_norm",
            "flatten",
            "flatten_norm",
            *stages,
        ]
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building timm %s (TRUNK_ONLY %s): output width %d", name, self.trunk_only, width
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``trunk_pool`` with
        TRUNK_ONLY, else ``flatten``).

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(
            out_feat_keys, self.feature_names, self.default_feature, "mobilenetv3_timm"
        )
        stages_only = all(n.startswith("stage") for n in names)
        last = len(self.model.blocks) - 1
        if stages_only:
            last = max(int(n[len("stage") :]) for n in names)
        m = self.model
        feat = m.bn1(m.conv_stem(transform_model_input_data_type(x, self.input_type)))
        out: dict[str, torch.Tensor] = {}
        for i, stage in enumerate(m.blocks[: last + 1]):
            feat = maybe_checkpoint(stage, self.use_checkpointing, self, feat)
            out[f"stage{i}"] = feat
        if not stages_only:
            out["trunk"] = feat
            out["trunk_pool"] = _pool(feat)
            out["trunk_pool_norm"] = F.normalize(out["trunk_pool"], dim=-1)
            if "flatten" in names or "flatten_norm" in names:
                out["flatten"] = m.forward_head(feat, pre_logits=True)
                out["flatten_norm"] = F.normalize(out["flatten"], dim=-1)
        return [out[n] for n in names]


@register_model_trunk("mobilenetv3_tv")
class MobileNetV3TV(nn.Module):
    """torchvision's MobileNet-V3 (no classifier) with VISSL's feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.MOBILE_NET and INPUT_TYPE (rgb | bgr).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad MOBILE_NET value or INPUT_TYPE.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "mobilenetv3_tv") -> None:
        super().__init__()
        import torchvision.models as tv_models

        self.model_config = model_config
        p = parse_trunk(MobileNetParams, model_config, "MOBILE_NET")
        name = p.NAME
        if name not in TORCHVISION_NAMES:
            raise trunk_error(
                "MOBILE_NET", "NAME", name, f"must be one of {list(TORCHVISION_NAMES)}."
            )
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        if self.input_type not in ("rgb", "bgr"):
            raise ConfigError(
                f"config.MODEL.INPUT_TYPE={self.input_type!r}: mobilenetv3_tv takes 3-channel "
                "images; use rgb or bgr.",
                "config.MODEL.INPUT_TYPE",
            )
        # timm trains with PyTorch's BatchNorm defaults; torchvision uses eps 1e-3, 0.01
        norm = partial(nn.BatchNorm2d, eps=1e-5, momentum=0.1) if p.TIMM_BN else None
        builder = getattr(tv_models, TORCHVISION_NAMES[name])
        self.model = builder(weights=None, norm_layer=norm)
        self.model.classifier = nn.Identity()
        last_conv = [m for m in self.model.features.modules() if isinstance(m, nn.Conv2d)][-1]
        self.output_dim = int(last_conv.out_channels)
        self.feature_names = ["trunk", "trunk_pool", "trunk_pool_norm"]
        logger.info("Building torchvision %s: output width %d", name, self.output_dim)

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``trunk_pool``).

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(out_feat_keys, self.feature_names, "trunk_pool", "mobilenetv3_tv")
        feat = self.model.features(transform_model_input_data_type(x, self.input_type))
        pooled = torch.flatten(self.model.avgpool(feat), 1)
        out = {"trunk": feat, "trunk_pool": pooled}
        if "trunk_pool_norm" in names:
            out["trunk_pool_norm"] = F.normalize(pooled, dim=-1)
        return [out[n] for n in names]
