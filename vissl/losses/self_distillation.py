"""What the self-distillation losses share (DINO, iBOT, DINOv2): the teacher's targets
(centering over the global batch, or Sinkhorn-Knopp), the soft cross entropy, the KoLeo
regulariser, the teacher forward on iBOT's masked multi-crop batches and VISSL's config
inference for them.

The multi-crop masked batch (``ibot_multicrop_masking_collator``, VISSL's layout)::

    {"global_views": Tensor(G * B, C, H, W),   # crop-major: crop 0 of every sample, ...
     "local_views": Tensor(L * B, C, h, w),    # absent without local crops
     "mask": Tensor(G * B, H / p, W / p)}      # True = masked, for the global crops

The model maps ``global_views`` to ``lastBLK`` (the class token and the patch tokens; the
mask goes to the trunk, which replaces the masked patches by its mask token) and
``local_views`` to ``lastCLS``, both into the ``ibot_head``. The teacher sees the
global crops without masks (:func:`teacher_global_output`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from vissl.config.params import check_value
from vissl.errors import ConfigError
from vissl.losses.config_inference import find_head_params
from vissl.losses.swav_common import distributed_sinkhorn
from vissl.losses.teacher_hooks import DrivenByMomentumTeacherHook
from vissl.models.center import Center, ema_center_, global_row_sum_and_count
from vissl.models.momentum import (
    MomentumTeacher,
    MomentumTeacherOwner,
    TeacherStep,
    build_momentum_schedule,
    schedule_position,
)

__all__ = [
    "GLOBAL_VIEWS",
    "LOCAL_VIEWS",
    "MASK",
    "Center",
    "MaskedDistillationOutput",
    "SelfDistillationLoss",
    "ema_center_",
    "global_row_sum_and_count",
    "infer_masked_distillation_config",
    "koleo_loss",
    "masked_rows",
    "pairwise_cls_cross_entropy",
    "sinkhorn_knopp_targets",
    "soft_cross_entropy",
    "split_student_output",
    "teacher_global_output",
]

#: VISSL's batch keys of iBOT's collator (the model's inputs)
GLOBAL_VIEWS = "global_views"
LOCAL_VIEWS = "local_views"
MASK = "mask"
COLLATOR = "ibot_multicrop_masking_collator"


# --------------------------------------------------------------------------- targets
def soft_cross_entropy(
    targets: torch.Tensor, student_logits: torch.Tensor, student_temp: float
) -> torch.Tensor:
    """``-sum_k targets_k log softmax(student_logits / student_temp)_k`` per row, float32."""
    log_p = F.log_softmax(student_logits.float() / student_temp, dim=-1)
    return -(targets.float() * log_p).sum(dim=-1)


@torch.no_grad()
def sinkhorn_knopp_targets(
    teacher_logits: torch.Tensor,
    teacher_temp: float,
    num_iters: int = 3,
    num_samples: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """DINOv2's Sinkhorn-Knopp "centering": targets whose columns (prototypes) carry equal
    mass over the GLOBAL batch and whose rows sum to 1.

    SwAV's :func:`~vissl.losses.swav_common.distributed_sinkhorn` on
    ``exp(teacher_logits / teacher_temp)`` (its epsilon is the teacher temperature).

    Args:
        teacher_logits: ``(N, K)`` rows of this rank.
        teacher_temp: the teacher temperature.
        num_iters: Sinkhorn-Knopp iterations (DINOv2: 3).
        num_samples: the number of rows over every rank; None: ``N x world size`` (equal
            rows per rank, DINOv2's class tokens). DINOv2's masked patches pass their
            all-reduced count.
    """
    return distributed_sinkhorn(
        teacher_logits.float(), teacher_temp, num_iters, num_samples=num_samples
    )


def koleo_loss(features: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The Kozachenko-Leonenko entropy estimator as a loss (Sablayrolles et al. 2019,
    DINOv2's ``KoLeoLoss``): ``-mean_i log(||x_i - x_nn(i)|| + eps)`` over the
    L2-normalised rows ``x``, ``nn(i)`` the nearest other row. Computed on this rank's
    rows only, as in DINOv2; in float32 also under autocast.
    """
    with torch.autocast(features.device.type, enabled=False):
        x = F.normalize(features.float(), p=2, dim=-1, eps=eps)
        dots = x @ x.t()
        dots.fill_diagonal_(-2.0)  # below any cosine: a row is never its own neighbour
        nearest = dots.argmax(dim=1)
        distances = F.pairwise_distance(x, x[nearest], p=2, eps=eps)
        return -torch.log(distances + eps).mean()


def pairwise_cls_cross_entropy(
    targets: Sequence[torch.Tensor],
    student_logits: Sequence[torch.Tensor],
    student_temp: float,
    teacher_crops: Sequence[int] | None = None,
) -> torch.Tensor:
    """DINO's cross entropy: the mean over the pairs (teacher crop q, student crop v != q)
    of the mean over samples of :func:`soft_cross_entropy`.

    Args:
        targets: the teacher's targets, one ``(B, K)`` per teacher crop.
        student_logits: the student's logits, one ``(B, K)`` per crop.
        student_temp: the student's temperature.
        teacher_crops: the student crop each target is of (DINO's ``crops_for_teacher``);
            None: the first ``len(targets)`` crops.
    """
    crops = range(len(targets)) if teacher_crops is None else teacher_crops
    log_probs = [F.log_softmax(s.float() / student_temp, dim=-1) for s in student_logits]
    total = student_logits[0].new_zeros((), dtype=torch.float32)
    terms = 0
    for q, target in zip(crops, targets, strict=True):
        for v, log_p in enumerate(log_probs):
            if v != q:
                total = total - (target.float() * log_p).sum(dim=-1).mean()
                terms += 1
    return total / max(terms, 1)


def masked_rows(patch_output: torch.Tensor, flat_mask: torch.Tensor) -> torch.Tensor:
    """The masked patches' rows ``(M, K)`` of a head's patch output, in mask order.

    ``patch_output`` is either every patch, ``(N, L, K)``, or already the masked ones,
    ``(M, K)`` (``ibot_head`` with ``masked_patches_only``).
    """
    if patch_output.ndim == 3:
        return patch_output[flat_mask]
    return patch_output


# --------------------------------------------------------------------------- outputs
class MaskedDistillationOutput:
    """The student's output on an iBOT batch, taken apart.

    Attributes:
        cls: ``(G * B, K)`` [CLS] logits of the (masked) global crops.
        patch: the global crops' patch logits, ``(G * B, L, K_p)`` or ``(M, K_p)``.
        cls_token: ``(G * B, D)`` the trunk's class token (``output_cls_token``) or None.
        local_cls: ``(L_c * B, K)`` [CLS] logits of the local crops, or None.
    """

    def __init__(
        self,
        cls: torch.Tensor,
        patch: torch.Tensor,
        cls_token: torch.Tensor | None,
        local_cls: torch.Tensor | None,
    ) -> None:
        self.cls = cls
        self.patch = patch
        self.cls_token = cls_token
        self.local_cls = local_cls


def _tensors(item: Any) -> list[torch.Tensor]:
    if isinstance(item, torch.Tensor):
        return [item]
    out: list[torch.Tensor] = []
    for x in item:
        out.extend(_tensors(x))
    return out


def split_student_output(output: Any, loss_name: str) -> MaskedDistillationOutput:
    """``[[cls, patch(, cls_token)], [local_cls]]`` (one entry per MULTI_INPUT_HEAD_MAPPING
    entry: global views first, then local views) taken apart; without local crops the
    output may be the global entry itself, ``[cls, patch(, cls_token)]``.

    Raises:
        ValueError: the output does not have that structure.
    """
    entries = list(output) if not isinstance(output, torch.Tensor) else []
    if entries and isinstance(entries[0], torch.Tensor):
        # global views only: the train step unwraps a model output of one entry
        entries = [entries]
    if not entries or len(entries) > 2:
        raise ValueError(
            f"{loss_name} expects the model output [global views' [cls, patch], local views' "
            "[cls]] (MULTI_INPUT_HEAD_MAPPING global_views then local_views, into an "
            f"ibot_head); got {type(output).__name__} of {len(entries)} entries."
        )
    global_out = _tensors(entries[0])
    if len(global_out) not in (2, 3) or global_out[0].ndim != 2:
        raise ValueError(
            f"{loss_name}: the global views' output must be [cls logits (N, K), patch logits "
            "(N, L, K) or (M, K)(, class token)] from an ibot_head fed lastBLK; got shapes "
            f"{[tuple(t.shape) for t in global_out]}."
        )
    local = None
    if len(entries) == 2:
        local_out = _tensors(entries[1])
        if len(local_out) != 1 or local_out[0].ndim != 2:
            raise ValueError(
                f"{loss_name}: the local views' output must be one (N, K) tensor (lastCLS into "
                f"the ibot_head); got shapes {[tuple(t.shape) for t in local_out]}."
            )
        local = local_out[0]
    token = global_out[2] if len(global_out) == 3 else None
    return MaskedDistillationOutput(global_out[0], global_out[1], token, local)


def _forward_takes_mask(module: nn.Module) -> bool:
    import inspect

    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return MASK in params


def teacher_global_output(teacher: nn.Module, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The teacher's head output on the global views, WITHOUT masking the trunk's input.

    The teacher is a copy of the student model: its MULTI_INPUT_HEAD_MAPPING entry for
    ``global_views`` gives the trunk features and the head. The trunk gets no mask (the
    teacher sees whole crops); the head gets the mask when its ``forward`` takes one (so
    that ``masked_patches_only`` scores the same patches as the student's).

    Raises:
        ValueError: the inputs are not an iBOT batch or the model has no such mapping.
    """
    if not isinstance(inputs, Mapping) or GLOBAL_VIEWS not in inputs or MASK not in inputs:
        raise ValueError(
            f"the teacher expects the inputs {{{GLOBAL_VIEWS!r}, {MASK!r}, ...}} of "
            f"{COLLATOR}; got {type(inputs).__name__}"
            + (f" with keys {sorted(inputs)}" if isinstance(inputs, Mapping) else "")
            + "."
        )
    head_for_input = getattr(teacher, "head_for_input", None)
    if not callable(head_for_input):
        raise ValueError(
            f"the teacher ({type(teacher).__name__}) is not a multi_input_output_model with "
            "MULTI_INPUT_HEAD_MAPPING."
        )
    feature_names, head = head_for_input(GLOBAL_VIEWS)
    trunk: Any = teacher.trunk
    feats = trunk(inputs[GLOBAL_VIEWS], feature_names)
    feats = [feats] if isinstance(feats, torch.Tensor) else list(feats)
    if len(feats) != 1:
        raise ValueError(f"the teacher's trunk returned {len(feats)} features for global_views.")
    if _forward_takes_mask(head):
        out = head(feats[0], mask=inputs[MASK])
    else:
        out = head(feats[0])
    return _tensors(out)


# --------------------------------------------------------------------------- config
def infer_masked_distillation_config(
    params: MutableMapping[str, Any], config: Mapping[str, Any], key: str
) -> Mapping[str, Any]:
    """Check an iBOT-style config and fill the loss's inferred keys (VISSL's inference).

    Sets ``out_dim`` / ``patch_out_dim`` from the ``ibot_head`` and ``num_global_crops`` /
    ``num_local_crops`` from ``ImgPilToMultiCrop``. Returns the ``ibot_head`` kwargs.

    Raises:
        ConfigError: the collator, the input keys, the mapping, the trunk's masking or the
            masking transform's patch size do not fit the method, naming the key.
    """
    data = config["DATA"]["TRAIN"]
    model = config["MODEL"]
    collator = data.get("COLLATE_FUNCTION")
    if collator != COLLATOR:
        raise ConfigError(
            f"{key}: needs config.DATA.TRAIN.COLLATE_FUNCTION: {COLLATOR} (global views, "
            f"local views and the global views' masks); got {collator!r}.",
            "config.DATA.TRAIN.COLLATE_FUNCTION",
        )
    inputs = list(data.get("INPUT_KEY_NAMES") or [])
    if GLOBAL_VIEWS not in inputs or MASK not in inputs:
        raise ConfigError(
            f"{key}: config.DATA.TRAIN.INPUT_KEY_NAMES must list {GLOBAL_VIEWS}, {MASK} (and "
            f"{LOCAL_VIEWS} with local crops), e.g. [global_views, local_views, mask]; got "
            f"{inputs}.",
            "config.DATA.TRAIN.INPUT_KEY_NAMES",
        )
    targets = list(data.get("TARGET_KEY_NAMES") or [])
    if targets != [MASK]:
        raise ConfigError(
            f"{key}: config.DATA.TRAIN.TARGET_KEY_NAMES must be [mask] (the loss needs the "
            f"student's masks); got {targets}.",
            "config.DATA.TRAIN.TARGET_KEY_NAMES",
        )
    mapping = list(model.get("MULTI_INPUT_HEAD_MAPPING") or [])
    first = mapping[0] if mapping else None
    ok = (
        first is not None
        and len(first) == 2
        and first[0] == GLOBAL_VIEWS
        and isinstance(first[1], Mapping)
        and MASK in list(first[1].get("additional_keys") or [])
    )
    if not ok:
        raise ConfigError(
            f"{key}: config.MODEL.MULTI_INPUT_HEAD_MAPPING must start with "
            '["global_views", {"feat_names": ["lastBLK"], "additional_keys": ["mask"]}] '
            '(then ["local_views", {"feat_names": ["lastCLS"]}] with local crops), so that '
            f"the student's trunk masks the global views; got {mapping}.",
            "config.MODEL.MULTI_INPUT_HEAD_MAPPING",
        )
    trunk = model.get("TRUNK", {})
    vit = trunk.get("VISION_TRANSFORMERS", {}) or {}
    mim = (vit.get("MASKED_IMAGE_MODELING") or {}).get("NAME", "")
    if trunk.get("NAME") != "vision_transformer" or mim != "ibot":
        raise ConfigError(
            f"{key}: the trunk must be vision_transformer with "
            "MASKED_IMAGE_MODELING.NAME: ibot (a learned mask token replaces the masked "
            f"patches); got trunk {trunk.get('NAME')!r} with NAME {mim!r}.",
            "config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME",
        )
    patch = vit.get("PATCH_SIZE", 16)
    num_global = num_local = None
    for i, t in enumerate(data.get("TRANSFORMS") or []):
        name = t.get("name") if isinstance(t, Mapping) else None
        if name == "MaskedImageModeling" and t.get("patch_size", 16) != patch:
            raise ConfigError(
                f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size is {t.get('patch_size', 16)} but "
                f"the trunk's PATCH_SIZE is {patch}: the masks must be over the trunk's patch "
                "grid; set them equal.",
                f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size",
            )
        if name == "ImgPilToMultiCrop":
            counts = list(t.get("num_crops") or [])
            if counts:
                num_global = int(counts[0])
                num_local = int(t.get("total_num_crops", sum(counts))) - num_global
    if num_global is not None:
        params["num_global_crops"] = num_global
        params["num_local_crops"] = num_local
    head = find_head_params(model.get("HEAD", {}).get("PARAMS", []), "ibot_head")
    if head is None:
        raise ConfigError(
            f"{key}: config.MODEL.HEAD.PARAMS must hold an ibot_head (its [CLS] and patch "
            "outputs are what the loss compares).",
            "config.MODEL.HEAD.PARAMS",
        )
    from vissl.models.heads.ibot_head import PosInt

    out_dim = check_value(
        head.get("out_dim"), PosInt, "config.MODEL.HEAD.PARAMS[ibot_head].out_dim"
    )
    params["out_dim"] = out_dim
    params["patch_out_dim"] = head.get("patch_out_dim") or out_dim
    return head


def check_batch_layout(
    out: MaskedDistillationOutput,
    teacher: Sequence[torch.Tensor],
    flat_mask: torch.Tensor,
    num_global: int,
    num_local: int,
    loss_name: str,
) -> int:
    """The per-crop batch size ``B``, after checking the student's, the teacher's and the
    mask's shapes against each other.

    Raises:
        ValueError: shapes that do not fit ``num_global_crops`` / ``num_local_crops``.
    """
    rows = out.cls.shape[0]
    if rows % num_global:
        raise ValueError(
            f"{loss_name}: {rows} global [CLS] rows are not {num_global} crops of one batch."
        )
    batch = rows // num_global
    if flat_mask.shape[0] != rows:
        raise ValueError(
            f"{loss_name}: {flat_mask.shape[0]} masks for {rows} global crops (the mask target "
            "must be the global views' masks)."
        )
    local_rows = 0 if out.local_cls is None else out.local_cls.shape[0]
    if local_rows != num_local * batch:
        raise ValueError(
            f"{loss_name}: {local_rows} local [CLS] rows, expected num_local_crops "
            f"({num_local}) x {batch}."
        )
    if len(teacher) < 2 or teacher[0].shape != out.cls.shape:
        raise ValueError(
            f"{loss_name}: the teacher's output {[tuple(t.shape) for t in teacher]} does not "
            f"match the student's [CLS] {tuple(out.cls.shape)}."
        )
    if out.patch.ndim == 3 and out.patch.shape[:2] != flat_mask.shape:
        raise ValueError(
            f"{loss_name}: patch logits {tuple(out.patch.shape)} do not match the masks "
            f"{tuple(flat_mask.shape)}."
        )
    return batch


def uniform_entropy(width: int) -> float:
    """``ln(width)``: the cross entropy of uniform outputs of ``width`` entries."""
    return math.log(width)


# --------------------------------------------------------------------------- base
class SelfDistillationLoss(DrivenByMomentumTeacherHook, MomentumTeacherOwner, nn.Module):
    """The teacher side of ``dino_loss``, ``ibot_loss``, ``dinov2_loss`` and ``msn_loss``.

    The teacher is a :class:`~vissl.models.momentum.MomentumTeacher`: a frozen copy of
    the model made once (``bind_model``, before DDP wraps or ``torch.compile`` compiles
    the student), in eval mode except BatchNorm (no dropout, no drop path), whose EMA
    factor follows a cosine from ``momentum`` to ``final_momentum``. The copy is the
    submodule ``teacher``, so the checkpoints hold it (``teacher.*``) and a resume
    continues with it. In the trainer
    :class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook` drives it; its
    output reaches ``forward`` as the ``teacher_output`` argument.

    Args:
        momentum: the teacher's EMA factor at iteration 0.
        final_momentum: the EMA factor at the last iteration.
    """

    def __init__(self, momentum: float, final_momentum: float = 1.0) -> None:
        super().__init__()
        self.momentum = float(momentum)
        self.final_momentum = float(final_momentum)

    def momentum_schedule(self) -> ParamScheduler:
        """The cosine from ``momentum`` to ``final_momentum`` (DINO, iBOT, DINOv2, MSN)."""
        return build_momentum_schedule("cosine", self.momentum, self.final_momentum)

    def bind_model(self, model: nn.Module) -> None:
        """Make the teacher: a frozen copy of ``model`` (the plain module, not DDP)."""
        self.attach_teacher(MomentumTeacher(model, self.momentum_schedule()))

    def teacher_momentum_at(self, iteration: int, max_iteration: int) -> float:
        """The EMA factor of the update after ``iteration`` of ``max_iteration`` steps."""
        where = schedule_position(iteration, max_iteration)
        return self.momentum if where is None else float(self.momentum_schedule()(where))


class MaskedDistillationLoss(SelfDistillationLoss):
    """:class:`SelfDistillationLoss` whose teacher sees iBOT's masked multi-crop batch:
    the unmasked global views (:func:`teacher_global_output`); ``ibot_loss``,
    ``dinov2_loss`` and ``msn_loss``."""

    def run_teacher(self, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The teacher's head output on the unmasked global views."""
        assert self.teacher is not None
        return teacher_global_output(self.teacher, inputs)

    def schedule_inputs(self, step: TeacherStep) -> dict[str, Any]:
        """The temperatures of ``step`` (``forward``'s keyword arguments)."""
        return {}

    def set_schedule_position(self, iteration: int, epoch: int) -> None:
        """Make the temperatures of (``iteration``, ``epoch``) the defaults of ``forward``."""
        for name, value in self.schedule_inputs(TeacherStep(iteration, epoch)).items():
            setattr(self, name, value)

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The teacher's output on ``sample["input"]`` and the temperatures of ``step``."""
        return {"teacher_output": self.run_teacher(sample["input"]), **self.schedule_inputs(step)}

    def given_teacher_outputs(self, teacher_output: Any, loss_name: str) -> list[torch.Tensor]:
        """The teacher's outputs ``[cls, patch, ...]`` passed to ``forward``, detached."""
        teacher = self.given_teacher_output(teacher_output, loss_name)
        return [t.detach() for t in teacher]
