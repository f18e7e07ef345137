"""RegNet trunk ``regnet`` built from RegNet generating parameters.

Configured by MODEL.TRUNK.REGNET, with ClassyVision's keys and defaults (as VISSL):

- required: ``depth``, ``w_0``, ``w_a``, ``w_m``, ``group_width``;
- optional: ``bottleneck_multiplier`` (1.0), ``stem_width`` (32), ``use_se`` (True),
  ``se_ratio`` (0.25; so the default is a RegNetY), ``activation`` (relu | silu),
  ``bn_epsilon`` (1e-5), ``bn_momentum`` (0.1), ``stem_type`` (simple_stem_in),
  ``block_type`` (res_bottleneck_block);
- or ``name``: one of ClassyVision's named RegNets (``regnet_y_400mf``,
  ``regnet_x_1.6gf``, ...; torchvision's spelling ``regnet_y_1_6gf`` also works), plus
  any optional key above.

Stage widths are computed in float64 as ClassyVision does, and the network is
torchvision's ``RegNet`` (stem, ``trunk_output`` stages). Features, as in VISSL:
``conv1`` (stem), ``res2``, ``res3``, ... (one per stage), ``avgpool`` (N x C x 1 x 1;
alias ``res5avg`` when there are 4 stages) and ``flatten`` (N x C, the default output).
Parameter names follow torchvision, not ClassyVision; ``MODEL.WEIGHTS_INIT`` renames VISSL's
RegNet checkpoints (ClassyVision's names, SEER's grouped stages) to ours
(vissl/utils/vissl_key_maps.py).

VISSL's ``regnet_fsdp`` and ``regnet_v2`` trunks (SEER's) are this trunk too: their
parameters are the same, FSDP sharding comes from ``TRAINER.TASK_NAME:
self_supervision_fsdp_task``, and their ``stage_checkpoints`` / ``stage_checkpointing``
keys (which blocks FSDP and activation checkpointing group) are accepted and not used:
activation checkpointing follows ``MODEL.ACTIVATION_CHECKPOINTING``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn as nn
from torchvision.models.regnet import BlockParams
from torchvision.models.regnet import RegNet as TorchvisionRegNet

from vissl.errors import ConfigError
from vissl.models.model_helpers import (
    Flatten,
    cfg_get,
    get_trunk_forward_outputs,
    transform_model_input_data_type,
)
from vissl.models.trunks import register_model_trunk

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.TRUNK.REGNET"

REQUIRED_KEYS = ("depth", "w_0", "w_a", "w_m", "group_width")
OPTIONAL_KEYS: dict[str, Any] = {
    "bottleneck_multiplier": 1.0,
    "stem_type": "simple_stem_in",
    "stem_width": 32,
    "block_type": "res_bottleneck_block",
    "activation": "relu",
    "use_se": True,
    "se_ratio": 0.25,
    "bn_epsilon": 1e-5,
    "bn_momentum": 0.1,
}
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU}
#: Keys of VISSL's regnet_fsdp / regnet_v2 trunks that only group blocks for FSDP wrapping
#: and activation checkpointing: accepted, not used.
GROUPING_KEYS = ("stage_checkpoints", "stage_checkpointing")

#: ClassyVision's named RegNets: name -> generating parameters.
NAMED_REGNETS: dict[str, dict[str, Any]] = {
    "regnet_y_400mf": {"depth": 16, "w_0": 48, "w_a": 27.89, "w_m": 2.09, "group_width": 8},
    "regnet_y_800mf": {"depth": 14, "w_0": 56, "w_a": 38.84, "w_m": 2.4, "group_width": 16},
    "regnet_y_1.6gf": {"depth": 27, "w_0": 48, "w_a": 20.71, "w_m": 2.65, "group_width": 24},
    "regnet_y_3.2gf": {"depth": 21, "w_0": 80, "w_a": 42.63, "w_m": 2.66, "group_width": 24},
    "regnet_y_8gf": {"depth": 17, "w_0": 192, "w_a": 76.82, "w_m": 2.19, "group_width": 56},
    "regnet_y_16gf": {"depth": 18, "w_0": 200, "w_a": 106.23, "w_m": 2.48, "group_width": 112},
    "regnet_y_32gf": {"depth": 20, "w_0": 232, "w_a": 115.89, "w_m": 2.53, "group_width": 232},
    "regnet_y_64gf": {"depth": 20, "w_0": 368, "w_a": 102.79, "w_m": 2.05, "group_width": 496},
    "regnet_y_128gf": {"depth": 27, "w_0": 456, "w_a": 160.83, "w_m": 2.52, "group_width": 264},
    "regnet_y_256gf": {"depth": 27, "w_0": 640, "w_a": 124.47, "w_m": 2.04, "group_width": 848},
    "regnet_x_400mf": {"depth": 22, "w_0": 24, "w_a": 24.48, "w_m": 2.54, "group_width": 16},
    "regnet_x_800mf": {"depth": 16, "w_0": 56, "w_a": 35.73, "w_m": 2.28, "group_width": 16},
    "regnet_x_1.6gf": {"depth": 18, "w_0": 80, "w_a": 34.01, "w_m": 2.25, "group_width": 24},
    "regnet_x_3.2gf": {"depth": 25, "w_0": 88, "w_a": 26.31, "w_m": 2.25, "group_width": 48},
    "regnet_x_8gf": {"depth": 23, "w_0": 80, "w_a": 49.56, "w_m": 2.88, "group_width": 120},
    "regnet_x_16gf": {"depth": 22, "w_0": 216, "w_a": 55.59, "w_m": 2.1, "group_width": 128},
    "regnet_x_32gf": {"depth": 23, "w_0": 320, "w_a": 69.86, "w_m": 2.0, "group_width": 168},
}
for _name, _params in NAMED_REGNETS.items():
    if _name.startswith("regnet_x_"):
        _params["use_se"] = False


def _named_params(name: str) -> dict[str, Any]:
    key = name.lower().replace("_1_6gf", "_1.6gf").replace("_3_2gf", "_3.2gf")
    if key not in NAMED_REGNETS:
        raise ConfigError(
            f"{_KEY}.name={name!r} is not a known RegNet; known names: "
            f"{sorted(NAMED_REGNETS)}. Or give depth, w_0, w_a, w_m and group_width.",
            f"{_KEY}.name",
        )
    return dict(NAMED_REGNETS[key])


def regnet_stage_params(
    depth: int,
    w_0: float,
    w_a: float,
    w_m: float,
    group_width: int,
    bottleneck_multiplier: float = 1.0,
) -> tuple[list[int], list[int], list[int]]:
    """Per-stage (widths, depths, group widths) from RegNet generating parameters.

    Computed in float64 like ClassyVision/pycls, so widths match VISSL's models.
    """
    quant = 8
    widths_cont = [i * w_a + w_0 for i in range(depth)]
    block_widths = []
    for w in widths_cont:
        capacity = round(math.log(w / w_0) / math.log(w_m))
        block_widths.append(int(round(w_0 * math.pow(w_m, capacity) / quant) * quant))
    stage_widths: list[int] = []
    stage_depths: list[int] = []
    for w in block_widths:
        if stage_widths and stage_widths[-1] == w:
            stage_depths[-1] += 1
        else:
            stage_widths.append(w)
            stage_depths.append(1)
    # make stage widths compatible with the group width (through the bottleneck)
    group_widths = []
    adjusted = []
    for w in stage_widths:
        w_bot = int(w * bottleneck_multiplier)
        g = min(group_width, w_bot)
        w_bot = int(round(w_bot / g) * g)
        adjusted.append(int(w_bot / bottleneck_multiplier))
        group_widths.append(g)
    return adjusted, stage_depths, group_widths


def _read_params(trunk_config: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if "name" in trunk_config:
        params.update(_named_params(str(trunk_config["name"])))
    allowed = {"name", *REQUIRED_KEYS, *OPTIONAL_KEYS, *GROUPING_KEYS}
    for key, value in trunk_config.items():
        if key not in allowed:
            raise ConfigError(
                f"{_KEY}.{key} is not a RegNet parameter; allowed keys: {sorted(allowed)}.",
                f"{_KEY}.{key}",
            )
        if key in GROUPING_KEYS:
            logger.info(
                "%s.%s only groups blocks for VISSL's FSDP wrapping; not used here "
                "(activation checkpointing follows MODEL.ACTIVATION_CHECKPOINTING).",
                _KEY,
                key,
            )
        elif key != "name":
            params[key] = value
    for key in REQUIRED_KEYS:
        if key not in params:
            raise ConfigError(
                f"{_KEY}.{key} is required: a RegNet needs {list(REQUIRED_KEYS)} "
                f"(e.g. depth: 13, w_0: 24, w_a: 35.5, w_m: 2.49, group_width: 8), or "
                "a `name` such as regnet_y_400mf.",
                f"{_KEY}.{key}",
            )
    for key, default in OPTIONAL_KEYS.items():
        params.setdefault(key, default)

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{_KEY}.{key}={params[key]!r}: {why}", f"{_KEY}.{key}")

    if not isinstance(params["depth"], int) or params["depth"] <= 0:
        raise bad("depth", "must be a positive integer.")
    if not isinstance(params["w_0"], int | float) or params["w_0"] <= 0 or params["w_0"] % 8:
        raise bad("w_0", "must be a positive multiple of 8.")
    if not isinstance(params["w_a"], int | float) or params["w_a"] < 0:
        raise bad("w_a", "must be >= 0.")
    if not isinstance(params["w_m"], int | float) or params["w_m"] <= 1:
        raise bad("w_m", "must be > 1.")
    if not isinstance(params["group_width"], int) or params["group_width"] <= 0:
        raise bad("group_width", "must be a positive integer.")
    if params["bottleneck_multiplier"] <= 0:
        raise bad("bottleneck_multiplier", "must be > 0.")
    if str(params["stem_type"]).lower() != "simple_stem_in":
        raise bad("stem_type", "only 'simple_stem_in' is supported.")
    if str(params["block_type"]).lower() != "res_bottleneck_block":
        raise bad("block_type", "only 'res_bottleneck_block' is supported.")
    if str(params["activation"]).lower() not in _ACTIVATIONS:
        raise bad("activation", f"allowed values: {sorted(_ACTIVATIONS)}.")
    return params


@register_model_trunk("regnet")
class RegNet(nn.Module):
    """RegNet trunk (torchvision blocks) with VISSL's feature names.

    Args:
        model_config: config.MODEL; reads TRUNK.REGNET, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.
        model_name: the registry name (unused).
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "regnet") -> None:
        super().__init__()
        self.model_config = model_config
        self.input_type = cfg_get(model_config, "INPUT_TYPE", "rgb")
        if self.input_type not in ("rgb", "bgr"):
            raise ConfigError(
                f"config.MODEL.INPUT_TYPE={self.input_type!r} is not supported by the "
                "regnet trunk; use 'rgb' or 'bgr'.",
                "config.MODEL.INPUT_TYPE",
            )
        trunk_config = cfg_get(model_config, "TRUNK.REGNET", {}) or {}
        params = _read_params(trunk_config)
        self.params = params
        widths, depths, group_widths = regnet_stage_params(
            params["depth"],
            params["w_0"],
            params["w_a"],
            params["w_m"],
            params["group_width"],
            params["bottleneck_multiplier"],
        )
        self.stage_widths = widths
        self.stage_depths = depths
        se_ratio = params["se_ratio"] if params["use_se"] else None
        block_params = BlockParams(
            depths=depths,
            widths=widths,
            group_widths=group_widths,
            bottleneck_multipliers=[params["bottleneck_multiplier"]] * len(widths),
            strides=[2] * len(widths),
            se_ratio=se_ratio,
        )
        norm = partial(nn.BatchNorm2d, eps=params["bn_epsilon"], momentum=params["bn_momentum"])
        logger.info("Building RegNet: widths %s, depths %s, se_ratio %s", widths, depths, se_ratio)
        model = TorchvisionRegNet(
            block_params,
            num_classes=1,
            stem_width=params["stem_width"],
            norm_layer=norm,
            activation=_ACTIVATIONS[str(params["activation"]).lower()],
        )
        blocks: list[tuple[str, nn.Module]] = [("conv1", model.stem)]
        for stage in model.trunk_output.children():
            blocks.append((f"res{len(blocks) + 1}", stage))
        blocks.append(("avgpool", nn.AdaptiveAvgPool2d((1, 1))))
        blocks.append(("flatten", Flatten(1)))
        self._feature_blocks = nn.ModuleDict(dict(blocks))
        self.feat_eval_mapping: dict[str, str] = {name: name for name, _ in blocks}
        if len(widths) == 4:
            self.feat_eval_mapping["res5avg"] = "avgpool"
        self.output_dim = widths[-1]
        self.use_checkpointing = bool(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING", False)
        )
        self.num_checkpointing_splits = int(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS", 2)
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """Return the features named in ``out_feat_keys`` (default: ``["flatten"]``)."""
        model_input = transform_model_input_data_type(x, self.input_type)
        return get_trunk_forward_outputs(
            model_input,
            out_feat_keys=out_feat_keys,
            feature_blocks=self._feature_blocks,
            feature_mapping=self.feat_eval_mapping,
            use_checkpointing=self.use_checkpointing,
            checkpointing_splits=self.num_checkpointing_splits,
        )


# VISSL's SEER trunks: the same parameters (see the module docstring)
register_model_trunk("regnet_fsdp")(RegNet)
register_model_trunk("regnet_v2")(RegNet)
