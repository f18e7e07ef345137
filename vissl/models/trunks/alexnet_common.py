"""What VISSL's five AlexNet trunks share: feature names, blocks, config and forward.

The trunks (``alexnet_bvlc``, ``alexnet_jigsaw``, ``alexnet_colorization``,
``alexnet_deepcluster``, ``alexnet_rotnet``; one module each) are the AlexNet variants of
Goyal et al. 2019's benchmark and of the DeepCluster and RotNet papers. Each keeps nine
blocks in ``_feature_blocks`` (an ``nn.ModuleList``, as VISSL), tapped by VISSL's names:

=========  ====================================================  ==========================
name       block                                                 shape (227 px, bvlc)
=========  ====================================================  ==========================
conv1      conv1 (+ BatchNorm) + ReLU                            N x 96 x 55 x 55
pool1      max-pool (and LRN where the variant has one)          N x 96 x 27 x 27
conv2      conv2 (+ BatchNorm) + ReLU                            N x 256 x 27 x 27
pool2      max-pool (and LRN)                                    N x 256 x 13 x 13
conv3..5   conv (+ BatchNorm) + ReLU                             N x 384/384/256 x 13 x 13
pool5      3x3 stride-2 max-pool                                 N x 256 x 6 x 6
flatten    ``pool5`` flattened: **the default output**           N x 9216
=========  ====================================================  ==========================

The default output can be changed with MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT (e.g. ``conv5``
for colorization's per-pixel head). Inside a block, the convolution is ``.0``, its
BatchNorm ``.1``, so parameter names are VISSL's (``_feature_blocks.0.0.weight``,
``_feature_blocks.4.1.running_mean``, ...) and checkpoints written by VISSL, or by its
``extra_scripts/convert_caffe2_to_vissl_alexnet.py``, load unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.model_helpers import (
    Flatten,
    cfg_get,
    parse_out_keys_arg,
    transform_model_input_data_type,
)

#: VISSL's feature names of every AlexNet trunk, one per block of ``_feature_blocks``.
ALEXNET_FEATURE_NAMES: tuple[str, ...] = (
    "conv1",
    "pool1",
    "conv2",
    "pool2",
    "conv3",
    "conv4",
    "conv5",
    "pool5",
    "flatten",
)

_KEY = "config.MODEL.TRUNK.ALEXNET"
#: MODEL.TRUNK.ALEXNET keys and their defaults.
ALEXNET_OPTIONS: dict[str, Any] = {"DEFAULT_OUTPUT": "flatten"}


def conv_relu(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    groups: int = 1,
    batch_norm: bool = False,
) -> nn.Sequential:
    """Conv2d, an optional BatchNorm2d, then an in-place ReLU (VISSL's block layout)."""
    layers: list[nn.Module] = [
        nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size=kernel_size,
            stride=stride,
            padding=padding,
            groups=groups,
        )
    ]
    if batch_norm:
        layers.append(nn.BatchNorm2d(out_channels))
    layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def local_response_norm() -> nn.LocalResponseNorm:
    """Caffe AlexNet's LRN: 5 channels, alpha 1e-4, beta 0.75."""
    return nn.LocalResponseNorm(size=5, alpha=0.0001, beta=0.75)


def max_pool() -> nn.MaxPool2d:
    """AlexNet's overlapping 3x3 stride-2 max-pool."""
    return nn.MaxPool2d(kernel_size=3, stride=2)


def _first(value: Any) -> int:
    return int(value[0] if isinstance(value, tuple) else value)


def _out_size(size: int, module: nn.Module) -> int:
    """Spatial size after ``module`` (a block) for a square input of side ``size``."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.MaxPool2d):
            k, s, p = _first(layer.kernel_size), _first(layer.stride), _first(layer.padding)
            size = (size + 2 * p - k) // s + 1
    return size


class AlexNetTrunk(nn.Module):
    """Base of the AlexNet trunks: blocks tapped by VISSL's names, config checks.

    Args:
        model_config: config.MODEL; reads INPUT_TYPE and TRUNK.ALEXNET.
        model_name: the registry name (used in messages).
        blocks: the nine blocks, in the order of :data:`ALEXNET_FEATURE_NAMES`.
        channels: output channels of each block but ``flatten``.
        input_types: the MODEL.INPUT_TYPE values this variant takes.
        input_size: the input side the variant was trained at (documentation and
            :attr:`feature_shapes`).
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        model_name: str,
        blocks: Sequence[nn.Module],
        channels: Sequence[int],
        input_types: Sequence[str] = ("rgb", "bgr"),
        input_size: int = 227,
    ) -> None:
        super().__init__()
        assert len(blocks) == len(ALEXNET_FEATURE_NAMES)
        assert len(channels) == len(ALEXNET_FEATURE_NAMES) - 1
        self.model_config = model_config
        self.model_name = model_name
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        if self.input_type not in input_types:
            raise ConfigError(
                f"config.MODEL.INPUT_TYPE={self.input_type!r}: the {model_name} trunk takes "
                f"{' or '.join(repr(t) for t in input_types)} input"
                + (
                    " (the L channel of ImgPil2LabTensor's Lab tensor)."
                    if "lab" in input_types
                    else "; set config.MODEL.INPUT_TYPE to one of them."
                ),
                "config.MODEL.INPUT_TYPE",
            )
        options = self._read_options(cfg_get(model_config, "TRUNK.ALEXNET", None))
        self.default_output: str = options["DEFAULT_OUTPUT"]
        self.feature_names: list[str] = list(ALEXNET_FEATURE_NAMES)
        #: output channels of each tap (``flatten``: those of ``pool5``)
        self.feature_channels: dict[str, int] = dict(zip(ALEXNET_FEATURE_NAMES, channels))
        self.input_size = input_size
        self._feature_blocks = nn.ModuleList(blocks)

    def _read_options(self, options: Any) -> dict[str, Any]:
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"{_KEY} must be a mapping with keys {sorted(ALEXNET_OPTIONS)}; got {options!r}.",
                _KEY,
            )
        for key in options:
            if key not in ALEXNET_OPTIONS:
                raise ConfigError(
                    f"{_KEY}.{key} is not an AlexNet trunk option; allowed keys: "
                    f"{sorted(ALEXNET_OPTIONS)}.",
                    f"{_KEY}.{key}",
                )
        merged = {**ALEXNET_OPTIONS, **options}
        if merged["DEFAULT_OUTPUT"] not in ALEXNET_FEATURE_NAMES:
            raise ConfigError(
                f"{_KEY}.DEFAULT_OUTPUT={merged['DEFAULT_OUTPUT']!r} is not a feature of "
                f"the {self.model_name} trunk; choose one of {list(ALEXNET_FEATURE_NAMES)}.",
                f"{_KEY}.DEFAULT_OUTPUT",
            )
        return merged

    def feature_shapes(self, size: int | None = None) -> dict[str, tuple[int, ...]]:
        """Shape (without the batch dimension) of every tap for a square input of ``size``
        (default: the variant's own input size). A size of 0 or less means the input is
        too small for that block."""
        side = self.input_size if size is None else size
        shapes: dict[str, tuple[int, ...]] = {}
        for name, block in zip(ALEXNET_FEATURE_NAMES, self._feature_blocks):
            if name == "flatten":
                c, h, w = shapes["pool5"]
                shapes[name] = (c * h * w,)
                continue
            side = _out_size(side, block)
            shapes[name] = (self.feature_channels[name], side, side)
        return shapes

    def min_input_size(self, feature: str = "flatten") -> int:
        """The smallest square input side for which ``feature`` is at least 1 x 1."""
        name = "pool5" if feature == "flatten" else feature
        return next(s for s in range(1, 4096) if self.feature_shapes(s)[name][1] >= 1)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the first block (the variants override it: DeepCluster's Sobel)."""
        return transform_model_input_data_type(x, self.input_type)

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``[DEFAULT_OUTPUT]``).

        Raises:
            ConfigError: a name that is not one of :data:`ALEXNET_FEATURE_NAMES`.
            ValueError: the input is too small for the deepest requested block.
        """
        keys, deepest = parse_out_keys_arg(
            out_feat_keys or [self.default_output], self.feature_names
        )
        deepest_map = self.feature_names[min(deepest, self.feature_names.index("pool5"))]
        if self.feature_shapes(int(min(x.shape[-2:])))[deepest_map][1] < 1:
            need = self.min_input_size(deepest_map)
            raise ValueError(
                f"{self.model_name}: a {tuple(x.shape[-2:])} input is too small for the "
                f"{self.feature_names[deepest]!r} feature (it needs at least {need} px); "
                "crop or resize the images larger in the config's TRANSFORMS."
            )
        wanted = {self.feature_names.index(k): k for k in keys}
        outputs: dict[str, torch.Tensor] = {}
        feat = self.preprocess(x)
        for i, block in enumerate(self._feature_blocks[: deepest + 1]):
            feat = block(feat)
            if i in wanted:
                outputs[wanted[i]] = feat
        return [outputs[k] for k in keys]


def flatten_block() -> Flatten:
    """The last block: ``pool5`` flattened to N x C*h*w."""
    return Flatten(1)
