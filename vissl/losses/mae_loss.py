"""``mae_loss``: MAE's reconstruction loss, the mean squared error on the masked patches.

He et al., *Masked Autoencoders Are Scalable Vision Learners* (CVPR 2022), section 3:
the decoder (``mae_decoder``) predicts the pixels of every patch; the loss is computed on
the masked patches only. With ``norm_pix_loss`` (the paper's default, "normalized pixels")
each target patch is normalised by its own mean and standard deviation. For patch ``i`` of
image ``n`` with ``K = p * p * C`` values ``x_ni``, prediction ``y_ni`` and mask ``m_ni``
(1 = masked)::

    t_ni = (x_ni - mean(x_ni)) / sqrt(var(x_ni) + eps)       (norm_pix_loss; else t = x)
    loss = sum_ni m_ni * ||y_ni - t_ni||^2 / K  /  sum_ni m_ni

``var`` is the unbiased variance over the patch's ``K`` values (``torch.var``, as MAE's
code), ``eps = 1e-6``. The patches are cut as :func:`vissl.models.token_masking.patchify`
does (row-major, each patch's values in (row, column, channel) order), which is the
order ``mae_decoder``'s output follows.

The loss reads the images and the mask from the sample's target:
``DATA.TRAIN.TARGET_KEY_NAMES: [data, mask]`` makes ``sample["target"]`` the mapping
``{"data": images, "mask": masks}``. Every image hides the same number of patches
(RandomPatchMasking), so the mean over this rank's masked patches, averaged over ranks by
DDP, is the mean over the global batch's masked patches: nothing is gathered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import nn

from vissl.config.params import IntAtLeast, Note, Positive, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.models.token_masking import patchify

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.mae_loss"
_MASKING_TRANSFORMS = ("RandomPatchMasking", "MaskedImageModeling")


def mae_reconstruction_loss(
    prediction: torch.Tensor,
    images: torch.Tensor,
    mask: torch.Tensor,
    patch_size: int,
    norm_pix_loss: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The formula of the module docstring, in float32.

    Args:
        prediction: ``(N, L, p * p * C)``.
        images: ``(N, C, H, W)``, ``L = (H / p) * (W / p)``.
        mask: ``(N, H / p, W / p)`` or ``(N, L)``, True (or 1) = masked.
        patch_size: ``p``.
        norm_pix_loss: normalise each target patch by its mean and standard deviation.
        eps: added to the variance.

    Raises:
        ValueError: the shapes do not agree.
    """
    target = patchify(images.float(), patch_size)
    if prediction.shape != target.shape:
        raise ValueError(
            f"mae_loss: the prediction has shape {tuple(prediction.shape)} but the images "
            f"{tuple(images.shape)} cut into {patch_size} px patches give "
            f"{tuple(target.shape)}; the decoder's patch_size and in_chans must match the "
            "images (and config.LOSS.mae_loss.patch_size the trunk's PATCH_SIZE)."
        )
    weights = mask.reshape(target.shape[0], -1).to(torch.float32)
    if weights.shape != target.shape[:2]:
        raise ValueError(
            f"mae_loss: the mask has shape {tuple(mask.shape)}, but the images have "
            f"{target.shape[1]} patches each."
        )
    if norm_pix_loss:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + eps).sqrt()
    per_patch = (prediction.float() - target).pow(2).mean(dim=-1)
    return (per_patch * weights).sum() / weights.sum().clamp(min=1.0)


@dataclass(kw_only=True, frozen=True)
class MAEParams:
    """``config.LOSS.mae_loss``."""

    norm_pix_loss: bool = True
    #: null: the trunk's PATCH_SIZE (16 without a vision_transformer trunk)
    patch_size: Annotated[int, IntAtLeast(1), Note("the trunk's PATCH_SIZE")] | None = None
    eps: Annotated[float, Positive] = 1e-6


@register_loss("mae_loss")
class MAELoss(nn.Module):
    """MAE's loss (see the module docstring).

    Args:
        norm_pix_loss: normalise each target patch (MAE's default, better features).
        patch_size: the patch side in pixels; null: the trunk's PATCH_SIZE.
        eps: added to each patch's variance.
    """

    Params = MAEParams

    def __init__(
        self,
        norm_pix_loss: bool = MAEParams.norm_pix_loss,
        patch_size: int = 16,
        eps: float = MAEParams.eps,
    ) -> None:
        super().__init__()
        p = parse(
            MAEParams, {"norm_pix_loss": norm_pix_loss, "patch_size": patch_size, "eps": eps}, _KEY
        )
        if p.patch_size is None:  # null is for the config (the trunk's); here: a size
            raise ConfigError(
                f"{_KEY}.patch_size must be an integer >= 1 (the trunk's PATCH_SIZE), got None.",
                f"{_KEY}.patch_size",
            )
        self.norm_pix_loss = p.norm_pix_loss
        self.patch_size = p.patch_size
        self.eps = p.eps

    @classmethod
    def derive(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with ``patch_size`` from the trunk when null (a new mapping); the
        masking transforms must cut the same patches as the trunk.

        Raises:
            ConfigError: patch sizes that disagree, or a target without the images and
                the masks.
        """
        params = dict(params)
        model = config.get("MODEL", {}) or {}
        trunk = model.get("TRUNK", {}) or {}
        vit = trunk.get("VISION_TRANSFORMERS", {}) or {}
        trunk_patch = vit.get("PATCH_SIZE") if trunk.get("NAME") == "vision_transformer" else None
        if params.get("patch_size") is None:
            params["patch_size"] = trunk_patch if trunk_patch is not None else 16
        elif trunk_patch is not None and params["patch_size"] != trunk_patch:
            raise ConfigError(
                f"{_KEY}.patch_size={params['patch_size']} differs from the trunk's "
                f"config.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE={trunk_patch}; leave it "
                "null to use the trunk's.",
                f"{_KEY}.patch_size",
            )
        train = (config.get("DATA", {}) or {}).get("TRAIN", {}) or {}
        for i, entry in enumerate(train.get("TRANSFORMS", []) or []):
            if isinstance(entry, Mapping) and entry.get("name") in _MASKING_TRANSFORMS:
                size = entry.get("patch_size", 16)
                if size != params["patch_size"]:
                    raise ConfigError(
                        f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size={size} ({entry['name']}) "
                        f"differs from the patch size of the trunk and the loss "
                        f"({params['patch_size']}): the masks must be drawn on the trunk's "
                        "patch grid.",
                        f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size",
                    )
        targets = list(train.get("TARGET_KEY_NAMES", []) or [])
        if targets and not {"data", "mask"} <= set(targets):
            raise ConfigError(
                f"mae_loss needs the images and the masks as its target: set "
                f"config.DATA.TRAIN.TARGET_KEY_NAMES: [data, mask] (got {targets}).",
                "config.DATA.TRAIN.TARGET_KEY_NAMES",
            )
        return params

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> MAELoss:
        p = parse(MAEParams, params, _KEY)
        return cls(norm_pix_loss=p.norm_pix_loss, patch_size=p.patch_size or 16, eps=p.eps)

    def forward(self, output: Any, target: Any) -> torch.Tensor:
        """The loss of this rank's batch.

        Args:
            output: the decoder's prediction ``(N, L, p * p * C)`` (or a list of it).
            target: ``{"data": images (N, C, H, W), "mask": (N, h, w)}``.
        """
        if isinstance(output, Sequence) and not isinstance(output, torch.Tensor):
            if len(output) != 1:
                raise ValueError(
                    f"mae_loss takes one model output (the decoder's prediction), got "
                    f"{len(output)}."
                )
            output = output[0]
        if not isinstance(target, Mapping) or not {"data", "mask"} <= set(target):
            got = sorted(target) if isinstance(target, Mapping) else type(target).__name__
            raise ConfigError(
                "mae_loss needs the images and the patch masks as its target "
                f"(got {got}): set config.DATA.TRAIN.TARGET_KEY_NAMES: [data, mask] and a "
                "masking transform (RandomPatchMasking) in config.DATA.TRAIN.TRANSFORMS.",
                "config.DATA.TRAIN.TARGET_KEY_NAMES",
            )
        return mae_reconstruction_loss(
            output, target["data"], target["mask"], self.patch_size, self.norm_pix_loss, self.eps
        )

    def extra_repr(self) -> str:
        return f"norm_pix_loss={self.norm_pix_loss}, patch_size={self.patch_size}"
