"""Helpers shared by the trunks, heads and the base model.

The feature-block machinery follows VISSL: a trunk keeps its layers in an ordered
``nn.ModuleDict`` (``_feature_blocks``) and a name mapping (``conv1`` -> ``conv1_relu``,
``res5`` -> ``layer4`` ...) so that any intermediate feature can be requested by name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

_MISSING = object()


def cfg_get(cfg: Mapping[str, Any] | None, path: str, default: Any = None) -> Any:
    """Read ``path`` ("A.B.C") from a nested mapping, or ``default`` if any part is absent."""
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return default
        node = node.get(part, _MISSING)
        if node is _MISSING:
            return default
    return node


# --------------------------------------------------------------------------- small modules
class Flatten(nn.Module):
    """Flatten the input from ``dim`` on (``torch.flatten(x, start_dim=dim)``)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return torch.flatten(feat, start_dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Identity(nn.Module):
    """Return the input unchanged (accepts and ignores constructor arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class LayerNorm2d(nn.GroupNorm):
    """LayerNorm over (C, H, W) of a conv feature map: ``GroupNorm`` with one group."""

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__(num_groups=1, num_channels=num_channels, eps=eps, affine=affine)


class StandardizedConv2d(nn.Conv2d):
    """Conv2d with weight standardization (zero mean, unit variance per output filter)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        w = (w - mean) / torch.sqrt(var + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def flat_head_input(batch: torch.Tensor | Sequence[torch.Tensor], head: str) -> torch.Tensor:
    """A head's input as ``(N, D)``: a tensor or a list of one tensor, flattened after dim 0.

    Raises:
        ValueError: a list of more than one tensor.
    """
    if not isinstance(batch, torch.Tensor):
        if len(batch) != 1:
            raise ValueError(
                f"{head} expects a tensor or a list of one tensor; got a list of {len(batch)}."
            )
        batch = batch[0]
    return torch.flatten(batch, start_dim=1) if batch.ndim > 2 else batch


def standardize_convolutions(module: nn.Module) -> nn.Module:
    """Replace every plain ``nn.Conv2d`` inside ``module`` by a :class:`StandardizedConv2d`.

    Parameters are kept (same tensors), so state-dict keys do not change.
    """
    for name, child in list(module.named_children()):
        if type(child) is nn.Conv2d:
            new = StandardizedConv2d(
                child.in_channels,
                child.out_channels,
                child.kernel_size,  # type: ignore[arg-type]
                stride=child.stride,  # type: ignore[arg-type]
                padding=child.padding,  # type: ignore[arg-type]
                dilation=child.dilation,  # type: ignore[arg-type]
                groups=child.groups,
                bias=child.bias is not None,
                padding_mode=child.padding_mode,
            )
            new.weight = child.weight
            if child.bias is not None:
                new.bias = child.bias
            setattr(module, name, new)
        else:
            standardize_convolutions(child)
    return module


# --------------------------------------------------------------------------- input types
SUPPORTED_INPUT_TYPES = ("rgb", "bgr", "lab")


def input_channels(input_type: str) -> int:
    """Number of image channels a trunk receives for MODEL.INPUT_TYPE."""
    if input_type not in SUPPORTED_INPUT_TYPES:
        raise ConfigError(
            f"config.MODEL.INPUT_TYPE={input_type!r} is not supported; "
            f"use one of {list(SUPPORTED_INPUT_TYPES)}.",
            "config.MODEL.INPUT_TYPE",
        )
    return 1 if input_type == "lab" else 3


def transform_model_input_data_type(model_input: torch.Tensor, input_type: str) -> torch.Tensor:
    """Adapt an RGB batch to MODEL.INPUT_TYPE: ``bgr`` flips channels, ``lab`` keeps L only."""
    if input_type == "bgr":
        return model_input[:, [2, 1, 0], :, :]
    if input_type == "lab":
        return model_input[:, :1, :, :]
    return model_input


# --------------------------------------------------------------------------- feature blocks
def parse_out_keys_arg(
    out_feat_keys: Sequence[str] | None, all_feat_names: Sequence[str]
) -> tuple[list[str], int]:
    """Validate requested feature names; return them and the index of the deepest one.

    With no names, the last feature block is returned (VISSL's default).

    Raises:
        ConfigError: a requested name is not a feature of the trunk.
    """
    keys = list(out_feat_keys) if out_feat_keys else [all_feat_names[-1]]
    for key in keys:
        if key not in all_feat_names:
            raise ConfigError(
                f"Trunk has no feature named {key!r}; available features: "
                f"{list(all_feat_names)}. Check the feature names in "
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP.",
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP",
            )
    return keys, max(list(all_feat_names).index(k) for k in keys)


def _run_blocks(
    blocks: Sequence[tuple[str, nn.Module]], wanted: set[str], feat: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Run ``blocks`` in order; return the wanted intermediate outputs, then the last one."""
    saved = []
    for name, block in blocks:
        feat = block(feat)
        if name in wanted:
            saved.append(feat)
    return (*saved, feat)


def get_trunk_forward_outputs(
    feat: torch.Tensor,
    out_feat_keys: Sequence[str] | None,
    feature_blocks: nn.ModuleDict,
    feature_mapping: Mapping[str, str] | None = None,
    use_checkpointing: bool = False,
    checkpointing_splits: int = 2,
) -> list[torch.Tensor]:
    """Run ``feature_blocks`` on ``feat`` up to the deepest requested feature.

    Args:
        feat: the model input.
        out_feat_keys: feature names to return, either VISSL names (keys of
            ``feature_mapping``) or raw block names; ``None``/empty: the last block.
        feature_blocks: the ordered trunk blocks.
        feature_mapping: VISSL feature name -> block name.
        use_checkpointing: use activation checkpointing (only when grads are needed).
        checkpointing_splits: number of checkpointed segments.

    Returns:
        The requested features, in the order of ``out_feat_keys``.
    """
    mapping = dict(feature_mapping or {})
    block_names = list(feature_blocks.keys())
    # VISSL names first (``conv1`` means the stem output, not the raw conv block)
    known = list(mapping) + [k for k in block_names if k not in mapping]
    requested, _ = parse_out_keys_arg(out_feat_keys or [block_names[-1]], known)
    block_keys = [mapping.get(k, k) for k in requested]
    last = max(block_names.index(k) for k in block_keys)
    wanted = set(block_keys)
    blocks = [(n, feature_blocks[n]) for n in block_names[: last + 1]]

    outputs: dict[str, torch.Tensor] = {}
    if use_checkpointing and torch.is_grad_enabled() and checkpointing_splits > 0:
        n_splits = min(checkpointing_splits, len(blocks))
        size = -(-len(blocks) // n_splits)
        for start in range(0, len(blocks), size):
            segment = blocks[start : start + size]
            seg_wanted = [n for n, _ in segment if n in wanted]
            result = checkpoint(_run_blocks, segment, wanted, feat, use_reentrant=False)
            assert isinstance(result, tuple)
            outputs.update(zip(seg_wanted, result[:-1]))
            feat = result[-1]
    else:
        for name, block in blocks:
            feat = block(feat)
            if name in wanted:
                outputs[name] = feat
    return [outputs[k] for k in block_keys]


# --------------------------------------------------------------------------- model config
def is_feature_extractor_model(model_config: Mapping[str, Any]) -> bool:
    """True when the trunk is frozen and several layers are tapped for evaluation.

    That is: FEATURE_EVAL_SETTINGS.EVAL_MODE_ON, FREEZE_TRUNK_ONLY or
    FREEZE_TRUNK_AND_HEAD, and a non-empty LINEAR_EVAL_FEAT_POOL_OPS_MAP (as in VISSL).
    """
    fe = cfg_get(model_config, "FEATURE_EVAL_SETTINGS", {}) or {}
    return bool(
        fe.get("EVAL_MODE_ON", False)
        and (fe.get("FREEZE_TRUNK_ONLY", False) or fe.get("FREEZE_TRUNK_AND_HEAD", False))
        and len(fe.get("LINEAR_EVAL_FEAT_POOL_OPS_MAP", []) or []) > 0
    )


def get_trunk_output_feature_names(model_config: Mapping[str, Any]) -> list[str]:
    """Feature names the trunk is asked for: those of LINEAR_EVAL_FEAT_POOL_OPS_MAP in
    feature-extraction mode, otherwise ``[]`` (the trunk's default output)."""
    if not is_feature_extractor_model(model_config):
        return []
    ops_map = cfg_get(model_config, "FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP", [])
    names = []
    for i, item in enumerate(ops_map):
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise ConfigError(
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"
                f"[{i}] must be [feature_name, [pool_op_name, [args...]]], e.g. "
                f'["res5avg", ["Identity", []]]; got {item!r}.',
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP",
            )
        names.append(item[0])
    return names


def model_output_has_nan(model_output: Any) -> bool:
    """True if a tensor, or any tensor in a (nested) list of them, is not finite."""
    if isinstance(model_output, list | tuple):
        return any(model_output_has_nan(x) for x in model_output)
    if isinstance(model_output, torch.Tensor):
        return not bool(torch.isfinite(model_output).all())
    return False


def get_no_ddp_model(model: nn.Module) -> nn.Module:
    """The model inside its ``DistributedDataParallel`` and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod  # type: ignore[assignment]  # torch.compile's wrapper
        else:
            return model


# --------------------------------------------------------------------------- SyncBN
def split_world_in_process_groups(world_size: int, group_size: int) -> list[list[int]]:
    """Split ranks ``0..world_size-1`` into consecutive groups of at most ``group_size``."""
    return [
        list(range(s, min(s + group_size, world_size))) for s in range(0, world_size, group_size)
    ]


def convert_sync_bn(config: Mapping[str, Any], model: nn.Module) -> nn.Module:
    """VISSL's name for :func:`vissl.utils.sync_bn.convert_sync_batchnorm` (MODEL.SYNC_BN_CONFIG).

    A no-op with one process; torch's SyncBatchNorm on CUDA; a gloo implementation on CPU.
    """
    from vissl.utils.sync_bn import convert_sync_batchnorm

    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    return convert_sync_batchnorm(model, config, device)
