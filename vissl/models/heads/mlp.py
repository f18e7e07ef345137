"""``mlp`` head: a stack of Linear (-> BatchNorm1d) (-> ReLU) (-> Dropout) layers, optionally
ending in a BatchNorm1d without activation (``last_bn``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.heads import register_model_head
from vissl.models.model_helpers import cfg_get, flat_head_input

_KEY = "config.MODEL.HEAD.PARAMS"


def check_dims(dims: Any, head: str, min_len: int = 2) -> list[int]:
    """Validate a head's ``dims`` argument: a list of at least ``min_len`` positive ints."""
    if (
        not isinstance(dims, Sequence)
        or isinstance(dims, str)
        or len(dims) < min_len
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
    ):
        raise ConfigError(
            f"{_KEY}: head {head!r} needs `dims`, a list of at least {min_len} positive "
            f"integers such as [2048, 128] (input dim first); got {dims!r}.",
            _KEY,
        )
    return list(dims)


def check_last_bn(
    last_bn: Any, last_bn_affine: Any, skip_last_layer_relu_bn: Any, head: str
) -> None:
    """Refuse ``last_bn`` settings that are not bools or contradict each other.

    ``last_bn`` puts a BatchNorm1d alone after the last Linear, so it needs the default
    ``skip_last_layer_relu_bn: True`` (``False`` puts the hidden layers' BN/ReLU/Dropout
    there instead); ``last_bn_affine`` only describes that BatchNorm.
    """
    for name, value in (("last_bn", last_bn), ("last_bn_affine", last_bn_affine)):
        if not isinstance(value, bool):
            raise ConfigError(
                f"{_KEY}: head {head!r} needs `{name}` true or false; got {value!r}.", _KEY
            )
    if last_bn and not skip_last_layer_relu_bn:
        raise ConfigError(
            f"{_KEY}: head {head!r} has `last_bn: True` and `skip_last_layer_relu_bn: False`, "
            "which put two different things after the last Linear. For a BatchNorm alone "
            "there (SimSiam, MoCo v3, NNCLR), keep `skip_last_layer_relu_bn: True` (the "
            "default); for the hidden layers' BN/ReLU/Dropout there, drop `last_bn`.",
            _KEY,
        )
    if not last_bn and not last_bn_affine:
        raise ConfigError(
            f"{_KEY}: head {head!r} has `last_bn_affine: False` without `last_bn: True`; it "
            "describes the BatchNorm that `last_bn` adds after the last Linear. Set "
            "`last_bn: True` as well, or drop `last_bn_affine`.",
            _KEY,
        )


def check_use_bias(use_bias: Any, num_linear: int, head: str) -> list[bool]:
    """``use_bias`` as one bool per Linear layer: a bool for all of them, or a list of
    ``num_linear`` bools (BYOL's and SimSiam's heads drop the bias of some layers only)."""
    if isinstance(use_bias, bool):
        return [use_bias] * num_linear
    if (
        isinstance(use_bias, Sequence)
        and not isinstance(use_bias, str)
        and len(use_bias) == num_linear
        and all(isinstance(b, bool) for b in use_bias)
    ):
        return list(use_bias)
    raise ConfigError(
        f"{_KEY}: head {head!r} needs `use_bias` true or false, or a list of {num_linear} "
        f"of them (one per Linear layer, as `dims` has {num_linear + 1} sizes); got "
        f"{use_bias!r}.",
        _KEY,
    )


def scale_head_weights(module: nn.Module, model_config: Mapping[str, Any]) -> None:
    """Multiply every Linear weight and bias by MODEL.HEAD.PARAMS_MULTIPLIER."""
    multiplier = float(cfg_get(model_config, "HEAD.PARAMS_MULTIPLIER", 1.0))
    if multiplier == 1.0:
        return
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(multiplier)
                if m.bias is not None:
                    m.bias.mul_(multiplier)


@register_model_head("mlp")
class MLP(nn.Module):
    """Linear layers ``dims[0] -> dims[1] -> ...``, each optionally followed by
    BatchNorm1d, ReLU and Dropout (skipped after the last layer by default).

    After the last Linear comes, by the settings:

    - nothing (the default, ``skip_last_layer_relu_bn: True``);
    - what follows every other Linear (``skip_last_layer_relu_bn: False``): BN with
      ``use_bn``, ReLU with ``use_relu``, Dropout with ``use_dropout``, as in VISSL;
    - a BatchNorm1d alone, no activation (``last_bn: True``; ``last_bn_affine: False``
      for one without scale and shift), as SimSiam's and MoCo v3's projectors end
      (MoCo v3's ``_build_mlp(..., last_bn=True)``) and NNCLR's (affine). New in vissl.

    Accepts an N x D tensor, an N x D x 1 x 1 tensor, or a one-element list of them;
    any other shape is flattened from dim 1.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS, BATCHNORM_MOMENTUM,
            PARAMS_MULTIPLIER are read).
        dims: layer sizes, e.g. ``[2048, 2048, 128]``.
        use_bn: add BatchNorm1d after each Linear.
        use_relu: add ReLU after each Linear (after BN).
        use_dropout: add Dropout after each Linear (after ReLU).
        use_bias: Linear layers with bias: one bool for all, or one per Linear layer
            (``[True, False]``: no bias in the last; a list is new in vissl).
        skip_last_layer_relu_bn: no BN/ReLU/Dropout after the last Linear.
        last_bn: a BatchNorm1d, and nothing else, after the last Linear (needs
            ``skip_last_layer_relu_bn: True``).
        last_bn_affine: that BatchNorm1d has a learned scale and shift (needs
            ``last_bn: True`` when False).

    Raises:
        ConfigError: bad ``dims`` or ``use_bias``, or contradictory ``last_bn`` settings.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        dims: list[int],
        use_bn: bool = False,
        use_relu: bool = False,
        use_dropout: bool = False,
        use_bias: bool | Sequence[bool] = True,
        skip_last_layer_relu_bn: bool = True,
        last_bn: bool = False,
        last_bn_affine: bool = True,
    ) -> None:
        super().__init__()
        dims = check_dims(dims, "mlp")
        check_last_bn(last_bn, last_bn_affine, skip_last_layer_relu_bn, "mlp")
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        layers: list[nn.Module] = []
        n = len(dims) - 1
        biases = check_use_bias(use_bias, n, "mlp")
        for i in range(n):
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=biases[i]))
            if i == n - 1 and skip_last_layer_relu_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[i + 1], eps=eps, momentum=momentum))
            if use_relu:
                layers.append(nn.ReLU(inplace=True))
            if use_dropout:
                layers.append(nn.Dropout())
        if last_bn:
            layers.append(
                nn.BatchNorm1d(dims[-1], eps=eps, momentum=momentum, affine=last_bn_affine)
            )
        self.clf = nn.Sequential(*layers)
        scale_head_weights(self, model_config)

    def forward(self, batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return self.clf(flat_head_input(batch, "mlp head"))
