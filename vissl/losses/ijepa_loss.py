"""``ijepa_loss``: I-JEPA's loss and its target encoder (Assran et al., *Self-Supervised
Learning from Images with a Joint-Embedding Predictive Architecture*, CVPR 2023).

The target encoder is an exponential moving average of the context encoder (the model's
trunk). It sees the whole image; its patch tokens (the trunk's ``lastPATCH``, after the
trunk's final LayerNorm) are layer-normed once more without parameters, as I-JEPA's code
does, giving ``s_y``. The predictor (``ijepa_predictor``) predicts ``s_y`` on the ``M``
target blocks ``B_1 .. B_M`` from the context. For image ``n`` of ``N`` (every block of
the batch holds ``K`` patches, ``ijepa_multiblock_collator`` sees to it)::

    l2 (the paper's, eq. 1, averaged):
        loss = 1/(N M K) sum_n sum_i sum_{j in B_i(n)} || s^_nij - s_nj ||_2^2
    smooth_l1 (I-JEPA's code, ``F.smooth_l1_loss``, beta = 1), averaged over every element:
        loss = 1/(N M K D) sum_n sum_i sum_{j in B_i(n)} sum_d huber(s^_nijd - s_njd)

The paper's eq. 1 sums over the patches of each block; dividing by ``K`` (the same for the
whole batch) keeps the scale independent of the block size. The mean of each rank's
images, averaged over ranks by DDP, is the mean over the global batch (every rank holds
the same number of images): nothing is gathered.

The target encoder (a :class:`~vissl.models.momentum.MomentumTeacher`) follows the trunk
after every optimizer step (:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`,
its former name ``IJEPAHook`` an alias)::

    target = m * target + (1 - m) * trunk,   m = momentum + (final_momentum - momentum) * t / T

``t`` the optimizer steps done before this one, ``T`` the run's steps: I-JEPA's linear
schedule (0.996 to 1.0). The target encoder is a submodule of the loss (``target_encoder.
trunk.*`` in checkpoints; ``loss.teacher`` in code), so a resume continues with it; ``MODEL.WEIGHTS_INIT`` resets it
to the loaded weights.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from vissl.config.params import Note, OneOf, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.teacher_hooks import DrivenByMomentumTeacherHook
from vissl.models.momentum import (
    DROPPED_PREFIXES_ATTR,
    MomentumTeacher,
    MomentumTeacherOwner,
    TeacherStep,
    build_momentum_schedule,
    momentum_copy,
)
from vissl.models.token_masking import gather_tokens, keep_indices

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.ijepa_loss"
COLLATOR = "ijepa_multiblock_collator"
LOSS_TYPES = ("l2", "smooth_l1")
#: the trunk feature the target encoder outputs
TARGET_FEATURE = "lastPATCH"


@dataclass(kw_only=True, frozen=True)
class IJEPAParams:
    """``config.LOSS.ijepa_loss`` (I-JEPA's values)."""

    loss_type: Annotated[
        str,
        OneOf(*LOSS_TYPES),
        Note("'l2' is the paper's squared L2 distance, 'smooth_l1' I-JEPA's code's"),
    ] = "l2"
    momentum: Annotated[float, Unit] = 0.996
    final_momentum: Annotated[float, Unit] = 1.0


def linear_momentum(iteration: int, max_iteration: int, start: float, final: float) -> float:
    """I-JEPA's EMA factor after ``iteration`` optimizer steps of ``max_iteration``:
    linear from ``start`` to ``final``."""
    if max_iteration <= 0:
        return start
    progress = min(max(iteration / max_iteration, 0.0), 1.0)
    return start + (final - start) * progress


def target_block_tokens(tokens: torch.Tensor, target_masks: torch.Tensor) -> torch.Tensor:
    """The target blocks' tokens, block-major: ``(M * N, K, D)`` from the target encoder's
    ``(N, L, D)`` tokens and the ``(N, M, h, w)`` (or ``(N, M, L)``) masks, each block's
    patches in increasing patch order (the predictor's output order).

    Raises:
        ValueError: shapes that do not agree, or blocks of different sizes.
    """
    n, length, _ = tokens.shape
    if target_masks.shape[0] != n or target_masks[0, 0].numel() != length:
        raise ValueError(
            f"ijepa_loss: the target masks {tuple(target_masks.shape)} do not fit the target "
            f"encoder's tokens {tuple(tokens.shape)} (N images of L patches)."
        )
    num_blocks = int(target_masks.shape[1])
    blocks = target_masks.to(device=tokens.device, dtype=torch.bool).transpose(0, 1)
    blocks = blocks.reshape(num_blocks * n, length)
    counts = blocks.sum(dim=1)
    low, high = torch.stack(torch.aminmax(counts)).tolist()
    if low != high or low == 0:
        raise ValueError(
            f"ijepa_loss: the target blocks hold between {low} and {high} patches; every "
            f"block of a batch must hold the same number (> 0), as {COLLATOR} makes them."
        )
    return gather_tokens(tokens.repeat(num_blocks, 1, 1), keep_indices(~blocks, int(low)))


def ijepa_distance(prediction: torch.Tensor, target: torch.Tensor, loss_type: str) -> torch.Tensor:
    """The formula of the module docstring, in float32, for ``(M * N, K, D)`` tensors."""
    prediction, target = prediction.float(), target.float()
    if loss_type == "l2":
        return (prediction - target).pow(2).sum(dim=-1).mean()
    return F.smooth_l1_loss(prediction, target)


@register_loss("ijepa_loss")
class IJEPALoss(DrivenByMomentumTeacherHook, MomentumTeacherOwner, nn.Module):
    """I-JEPA's loss with its target encoder (see the module docstring).

    Args:
        loss_type: ``l2`` (the paper's) or ``smooth_l1`` (I-JEPA's code).
        momentum: the target encoder's EMA factor at the first step.
        final_momentum: the EMA factor at the last step.
    """

    Params = IJEPAParams

    def __init__(
        self,
        loss_type: str = IJEPAParams.loss_type,
        momentum: float = IJEPAParams.momentum,
        final_momentum: float = IJEPAParams.final_momentum,
    ) -> None:
        super().__init__()
        p = parse(
            IJEPAParams,
            {"loss_type": loss_type, "momentum": momentum, "final_momentum": final_momentum},
            _KEY,
        )
        self.loss_type = p.loss_type
        self.momentum = p.momentum
        self.final_momentum = p.final_momentum

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """Checks the pieces I-JEPA needs around the loss: the collator, the inputs and the
        target, the trunk's masking and the collator's patch size.

        Raises:
            ConfigError: a piece that does not fit, naming its key and the fix.
        """
        train = (config.get("DATA", {}) or {}).get("TRAIN", {}) or {}
        collator = train.get("COLLATE_FUNCTION", "default_collate")
        if collator != COLLATOR:
            raise ConfigError(
                f"ijepa_loss needs the multi-block masks: set config.DATA.TRAIN."
                f"COLLATE_FUNCTION: {COLLATOR} (got {collator!r}).",
                "config.DATA.TRAIN.COLLATE_FUNCTION",
            )
        inputs = list(train.get("INPUT_KEY_NAMES", []) or [])
        if not {"data", "mask", "target_masks"} <= set(inputs):
            raise ConfigError(
                "ijepa_loss: the model needs the images and both masks: set config.DATA.TRAIN."
                f"INPUT_KEY_NAMES: [data, mask, target_masks] (got {inputs}).",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        targets = list(train.get("TARGET_KEY_NAMES", []) or [])
        if targets != ["target_masks"]:
            raise ConfigError(
                "ijepa_loss takes the target blocks as its target: set config.DATA.TRAIN."
                f"TARGET_KEY_NAMES: [target_masks] (got {targets}).",
                "config.DATA.TRAIN.TARGET_KEY_NAMES",
            )
        model = config.get("MODEL", {}) or {}
        trunk = model.get("TRUNK", {}) or {}
        if trunk.get("NAME") != "vision_transformer":
            raise ConfigError(
                "ijepa_loss's encoders are ViTs: set config.MODEL.TRUNK.NAME: "
                f"vision_transformer (got {trunk.get('NAME')!r}).",
                "config.MODEL.TRUNK.NAME",
            )
        vit = trunk.get("VISION_TRANSFORMERS", {}) or {}
        masking = (vit.get("MASKED_IMAGE_MODELING", {}) or {}).get("NAME", "")
        if masking != "mae":
            raise ConfigError(
                "ijepa_loss: the context encoder must see the context patches only: set "
                "config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME: mae (got "
                f"{masking!r}).",
                "config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME",
            )
        collate_params = train.get("COLLATE_FUNCTION_PARAMS", {}) or {}
        patch = collate_params.get("patch_size", 16)
        trunk_patch = vit.get("PATCH_SIZE", 16)
        if patch != trunk_patch:
            raise ConfigError(
                f"config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.patch_size={patch} differs from "
                f"config.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE={trunk_patch}: the masks "
                "must be drawn on the trunk's patch grid.",
                "config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.patch_size",
            )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> IJEPALoss:
        return cls(**vars(parse(IJEPAParams, params, _KEY)))

    # ------------------------------------------------------------ target encoder
    #: the copy's checkpoint key (VISSL's name); ``loss.teacher`` in code
    teacher_state_key = "target_encoder"

    def momentum_schedule(self) -> ParamScheduler:
        """I-JEPA's linear EMA factor from ``momentum`` to ``final_momentum``."""
        return build_momentum_schedule("linear", self.momentum, self.final_momentum)

    def bind_model(self, model: nn.Module) -> None:
        """Make the target encoder: a frozen copy of ``model`` without its heads (the
        predictor), in eval mode (no drop path)."""
        target = momentum_copy(model)
        heads = getattr(target, "heads", None)
        if isinstance(heads, nn.ModuleList) and len(heads):
            setattr(target, DROPPED_PREFIXES_ATTR, tuple(f"heads.{i}" for i in range(len(heads))))
            target.heads = nn.ModuleList()
        self.attach_teacher(MomentumTeacher(target, self.momentum_schedule(), copy=False))

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The target encoder's layer-normed patch tokens of the whole images
        (``sample["input"]["data"]``)."""
        inputs = sample["input"]
        if not isinstance(inputs, Mapping) or "data" not in inputs:
            raise ConfigError(
                "ijepa_loss's target encoder needs the images as input 'data': set "
                "config.DATA.TRAIN.INPUT_KEY_NAMES: [data, mask, target_masks].",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        return {"teacher_output": self.run_target_encoder(inputs["data"])}

    @torch.no_grad()
    def run_target_encoder(self, images: torch.Tensor) -> torch.Tensor:
        """The target encoder's patch tokens of the whole images, layer-normed, ``(N, L, D)``."""
        if self.teacher is None:
            raise RuntimeError(
                "ijepa_loss.bind_model was not called: no target encoder (the trainer calls "
                "it when it builds the task)."
            )
        trunk = self.teacher.trunk
        assert isinstance(trunk, nn.Module)
        (tokens,) = trunk(images, [TARGET_FEATURE])
        return F.layer_norm(tokens, (tokens.shape[-1],))

    def momentum_at(self, iteration: int, max_iteration: int) -> float:
        """The EMA factor of the update after ``iteration`` steps (see the module docstring)."""
        return linear_momentum(iteration, max_iteration, self.momentum, self.final_momentum)

    # ------------------------------------------------------------ loss
    def forward(
        self, output: Any, target: Any, *, teacher_output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The loss of the predictor's ``output`` ``(M * N, K, D)`` against the target
        encoder's tokens ``teacher_output`` ``(N, L, D)`` (:meth:`run_target_encoder`) on
        the blocks ``target`` (the ``(N, M, h, w)`` target masks)."""
        if isinstance(output, Sequence) and not isinstance(output, torch.Tensor):
            if len(output) != 1:
                raise ValueError(
                    f"ijepa_loss takes one model output (the predictor's), got {len(output)}."
                )
            output = output[0]
        if not isinstance(target, torch.Tensor) or target.ndim not in (3, 4):
            raise ConfigError(
                "ijepa_loss takes the target masks (N, M, h, w) as its target: set "
                "config.DATA.TRAIN.TARGET_KEY_NAMES: [target_masks].",
                "config.DATA.TRAIN.TARGET_KEY_NAMES",
            )
        tokens = self.given_teacher_output(teacher_output, "ijepa_loss")
        expected = target_block_tokens(tokens.detach(), target)
        if output.shape != expected.shape:
            raise ValueError(
                f"ijepa_loss: the predictor gave {tuple(output.shape)} but the target blocks "
                f"hold {tuple(expected.shape)} (M * N, K, D): the predictor's in_dim must be "
                "the trunk's HIDDEN_DIM and it must get the same target masks."
            )
        return ijepa_distance(output, expected, self.loss_type)

    def extra_repr(self) -> str:
        return (
            f"loss_type={self.loss_type}, momentum={self.momentum} -> {self.final_momentum} "
            "(linear)"
        )
