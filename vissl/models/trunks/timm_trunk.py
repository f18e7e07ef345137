"""Trunk ``timm``: any model of the ``timm`` library as a vissl trunk.

Configured by MODEL.TRUNK.TIMM (docs/models/trunks.md):

- ``MODEL_NAME``: a ``timm.list_models()`` name, e.g. ``resnet18``, ``vit_tiny_patch16_224``,
  ``convnext_atto``. The model is always built with ``pretrained=False`` (vissl downloads
  nothing; load weights with MODEL.WEIGHTS_INIT, see vissl/utils/external_weights.py).
- ``KWARGS``: keyword arguments of ``timm.create_model`` (``img_size``, ``patch_size``,
  ``in_chans``, ``drop_path_rate``, ...). ``num_classes`` defaults to 0, so that the trunk's
  output is the pooled feature the heads take; ``in_chans`` defaults to the channels of
  MODEL.INPUT_TYPE (1 for ``lab``).

The timm model is the submodule ``timm_model``: its parameters are ``timm_model.<timm name>``
in the trunk and ``trunk.timm_model.<timm name>`` in a vissl checkpoint, so exporting
to timm's names is removing that prefix (``extra_scripts/export_trunk.py``).

Features (``out_feat_keys``; ``i`` counts the entries of the model's ``feature_info``):

=========  ===================================================  ============================
name       what                                                 shape
=========  ===================================================  ============================
pooled     the pooled pre-logits feature: **the default**       N x ``output_dim``
features   ``forward_features``: the last unpooled features     N x C x h x w (CNN),
                                                                N x tokens x D (ViT)
stage{i}   ``forward_intermediates`` output ``i``, i.e. the     N x C_i x h_i x w_i
           output of module ``feature_info[i]["module"]``       (ViT blocks as maps too)
=========  ===================================================  ============================

For a timm ResNet, ``stage0`` is the stem (``act1``) and ``stage1..4`` are ``layer1..4``
(vissl ResNet's ``conv1``, ``res2..res5``); for a ViT, ``stage{i}`` is block ``i``.
``pooled`` is ``timm_model(x)`` with ``num_classes=0``; its width, ``output_dim``, is the
model's ``head_hidden_size`` (``num_features`` where that is absent), the first ``dims``
entry of the first head.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.utils.external_weights import TIMM_TRUNK_PREFIX

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.TRUNK.TIMM"
_FEATURES_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"
#: The default feature (what the heads take).
POOLED = "pooled"
#: The unpooled output of ``forward_features``.
FEATURES = "features"
#: Prefix of the intermediate taps ``stage0``, ``stage1``, ...
STAGE = "stage"

# the submodule holding the timm model: its name is the prefix of the trunk's keys
_ATTR = TIMM_TRUNK_PREFIX.rstrip(".")


def import_timm() -> ModuleType:
    """The ``timm`` module.

    Raises:
        ConfigError: timm is not installed (names MODEL.TRUNK.TIMM.MODEL_NAME).
    """
    try:
        return importlib.import_module("timm")
    except ImportError as err:
        raise ConfigError(
            f"config.MODEL.TRUNK.NAME=timm needs the timm library, which is not installed "
            f"({err}); install it with `pip install timm` (or `pip install vissl[timm]`), "
            f"or pick another trunk than the one {_KEY}.MODEL_NAME names.",
            f"{_KEY}.MODEL_NAME",
        ) from err


def check_model_name(timm: ModuleType, name: Any) -> str:
    """``name`` when it is a timm model name.

    Raises:
        ConfigError: not a string, or no timm model has that name (close names suggested).
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{_KEY}.MODEL_NAME must name a timm model (e.g. resnet18, vit_tiny_patch16_224, "
            f"see timm.list_models()); got {name!r}.",
            f"{_KEY}.MODEL_NAME",
        )
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Close names: {close}." if close else ""
        raise ConfigError(
            f"{_KEY}.MODEL_NAME={name!r} is not a timm {timm.__version__} model.{hint} "
            "timm.list_models('<pattern>*') lists the names.",
            f"{_KEY}.MODEL_NAME",
        )
    return name


@register_model_trunk("timm")
class TimmTrunk(nn.Module):
    """A timm model (``pretrained=False``, no classifier) with vissl's feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.TIMM, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (timm's
            ``set_grad_checkpointing`` where the model has it).
        model_name: the registry name (unused; kept for VISSL's constructor signature).

    Raises:
        ConfigError: timm is missing, MODEL_NAME is unknown, or KWARGS do not build it.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "timm") -> None:
        super().__init__()
        self.model_config = model_config
        trunk_config: Mapping[str, Any] = cfg_get(model_config, "TRUNK.TIMM", {}) or {}
        timm = import_timm()
        self.timm_model_name = check_model_name(timm, trunk_config.get("MODEL_NAME", ""))
        kwargs = dict(trunk_config.get("KWARGS", {}) or {})
        if "pretrained" in kwargs:
            raise ConfigError(
                f"{_KEY}.KWARGS.pretrained: vissl builds timm models with pretrained=False "
                "(nothing is downloaded). Load weights with config.MODEL.WEIGHTS_INIT."
                "PARAMS_FILE (a timm state dict or .safetensors file) instead.",
                f"{_KEY}.KWARGS",
            )
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        kwargs.setdefault("num_classes", 0)
        kwargs.setdefault("in_chans", input_channels(self.input_type))
        self.timm_kwargs = kwargs
        try:
            model = timm.create_model(self.timm_model_name, pretrained=False, **kwargs)
        except (TypeError, ValueError, AssertionError, RuntimeError) as err:
            raise ConfigError(
                f"timm cannot build {self.timm_model_name!r} with {_KEY}.KWARGS={kwargs}: "
                f"{type(err).__name__}: {err}",
                f"{_KEY}.KWARGS",
            ) from err
        setattr(self, _ATTR, model)
        num_classes = kwargs["num_classes"]
        # with a classifier (KWARGS.num_classes > 0) "pooled" is its logits
        width: Any = getattr(model, "head_hidden_size", None) or getattr(model, "num_features", 0)
        self.output_dim = (
            num_classes if isinstance(num_classes, int) and num_classes > 0 else int(width)
        )
        info = getattr(model, "feature_info", None) or []
        #: ``stage{i}`` -> the timm module name it taps
        self.stage_modules: dict[str, str] = {
            f"{STAGE}{i}": str(entry.get("module", "")) for i, entry in enumerate(info)
        }
        self.feature_names = [POOLED, FEATURES, *self.stage_modules]
        if bool(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING", False)
        ):
            if hasattr(model, "set_grad_checkpointing"):
                model.set_grad_checkpointing(True)
            else:
                logger.warning(
                    "timm model %s has no set_grad_checkpointing: activation checkpointing off",
                    self.timm_model_name,
                )
        logger.info(
            "Building timm %s (%s): output width %d, taps %s",
            self.timm_model_name,
            kwargs,
            self.output_dim,
            self.feature_names,
        )

    @property
    def timm_model(self) -> nn.Module:
        """The wrapped timm model."""
        module = self._modules[_ATTR]
        assert module is not None
        return module

    def _stage_indices(self, names: list[str]) -> list[int]:
        if not self.stage_modules:
            raise ConfigError(
                f"timm model {self.timm_model_name!r} has no feature_info, so it has no "
                f"stage taps; request {POOLED!r} or {FEATURES!r} in {_FEATURES_KEY}.",
                _FEATURES_KEY,
            )
        if not hasattr(self.timm_model, "forward_intermediates"):
            raise ConfigError(
                f"timm model {self.timm_model_name!r} has no forward_intermediates, so "
                f"{names} cannot be tapped; request {POOLED!r} or {FEATURES!r} in "
                f"{_FEATURES_KEY}.",
                _FEATURES_KEY,
            )
        return sorted({int(n[len(STAGE) :]) for n in names})

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """Return the features named in ``out_feat_keys`` (default: ``["pooled"]``).

        Raises:
            ConfigError: a name is not one of :attr:`feature_names`.
        """
        names = list(out_feat_keys) if out_feat_keys else [POOLED]
        unknown = [n for n in names if n not in self.feature_names]
        if unknown:
            raise ConfigError(
                f"the timm trunk ({self.timm_model_name}) has no feature named "
                f"{unknown[0]!r}; available features: {self.feature_names}.",
                _FEATURES_KEY,
            )
        model: Any = self.timm_model
        x = transform_model_input_data_type(x, self.input_type)
        stages = [n for n in names if n.startswith(STAGE)]
        outputs: dict[str, torch.Tensor] = {}
        if stages:
            indices = self._stage_indices(stages)
            need_final = any(n in (POOLED, FEATURES) for n in names)
            if need_final:
                final, inter = model.forward_intermediates(x, indices=indices)
                outputs[FEATURES] = final
            else:
                inter = model.forward_intermediates(
                    x, indices=indices, intermediates_only=True, stop_early=True
                )
            outputs.update({f"{STAGE}{i}": t for i, t in zip(indices, inter)})
        elif FEATURES in names or POOLED in names:
            outputs[FEATURES] = model.forward_features(x)
        if POOLED in names:
            outputs[POOLED] = model.forward_head(outputs[FEATURES], pre_logits=False)
        return [outputs[n] for n in names]
