"""``ibot_loss``: iBOT's self-distillation (Zhou et al., *iBOT: Image BERT Pre-Training with
Online Tokenizer*, ICLR 2022), VISSL's name and keys.

A student sees the global crops with some patches replaced by a mask token, and the
local crops; a teacher (an EMA copy of the student) sees the global crops unmasked. With
``G`` global crops (``q``) and ``V = G + L`` crops in all (``v``), for sample ``i``::

    P_t(q)_i    = softmax((t_q,i - c) / tau_t)           # the teacher's [CLS], centred
    P_t(q)_i,j  = softmax((t_q,i,j - c2) / tau_t2)       # its patch j, centred
    L_cls   = mean over (q, v != q) of mean_i  -sum P_t(q)_i log softmax(s_v,i / tau_s)
    L_patch = mean over q of mean_i [ sum_j m_q,i,j * (-sum P_t(q)_i,j log softmax(
                  s_q,i,j / tau_s)) / max(1, sum_j m_q,i,j) ]
    loss    = lambda1 * L_cls + lambda2 * L_patch

``m`` is the student's mask (True = masked): the patch term distils the teacher's view of
each masked patch into the student's prediction there (masked image modelling with an
online tokenizer); an image without masked patches adds 0 to its mean. After each training
forward the centers follow the teacher over the GLOBAL batch (every rank's rows, divided
by the true count): ``c`` its [CLS] outputs, ``c2`` its patch outputs (all patches),
``c = center_momentum * c + (1 - center_momentum) * mean``. The temperatures rise
linearly per epoch (iBOT's ``np.linspace`` over ``warmup_teacher_temp_epochs``): ``tau_t``
from ``warmup_teacher_temp`` to ``teacher_temp``, ``tau_t2`` from
``warmup_teacher_patch_temp`` to ``teacher_patch_temp`` (after ``mim_start_epoch``).

Returns ``{"loss", "cls", "patch"}`` (VISSL's; the parts are logged as ``loss.cls`` and
``loss.patch``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from vissl.config.params import IntAtLeast, NonNegative, Positive, Unit, parse
from vissl.losses import register_loss
from vissl.losses.self_distillation import (
    MaskedDistillationLoss,
    check_batch_layout,
    infer_masked_distillation_config,
    pairwise_cls_cross_entropy,
    soft_cross_entropy,
    split_student_output,
)
from vissl.models.center import Center
from vissl.models.momentum import TeacherStep

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.ibot_loss"


@dataclass(kw_only=True, frozen=True)
class IBOTParams:
    """``config.LOSS.ibot_loss`` (iBOT's values; the crops, the head's widths and
    ``num_epochs`` are derived from the rest of the config)."""

    teacher_momentum: Annotated[float, Unit] = 0.996
    warmup_teacher_temp: Annotated[float, Positive] = 0.04
    teacher_temp: Annotated[float, Positive] = 0.04
    warmup_teacher_patch_temp: Annotated[float, Positive] = 0.04
    teacher_patch_temp: Annotated[float, Positive] = 0.07
    warmup_teacher_temp_epochs: Annotated[int, IntAtLeast(0)] = 30
    student_temp: Annotated[float, Positive] = 0.1
    center_momentum: Annotated[float, Unit] = 0.9
    center_momentum2: Annotated[float, Unit] = 0.9
    lambda1: Annotated[float, NonNegative] = 1.0
    lambda2: Annotated[float, NonNegative] = 1.0
    mim_start_epoch: Annotated[int, IntAtLeast(0)] = 0
    num_global_crops: Annotated[int, IntAtLeast(1)] = 2
    num_local_crops: Annotated[int, IntAtLeast(0)] = 8
    out_dim: Annotated[int, IntAtLeast(1)] = 8192
    patch_out_dim: Annotated[int, IntAtLeast(1)] = 8192
    num_epochs: Annotated[int, IntAtLeast(0)] = 10


def ibot_temperature(
    epoch: int, warmup: float, final: float, warmup_epochs: int, start_epoch: int = 0
) -> float:
    """iBOT's teacher temperature at ``epoch``: ``warmup`` until ``start_epoch``, then
    ``np.linspace(warmup, final, warmup_epochs)`` one value per epoch, then ``final``."""
    e = epoch - start_epoch
    if e < 0:
        return warmup
    if e >= warmup_epochs:
        return final
    if warmup_epochs == 1:
        return warmup
    return warmup + (final - warmup) * e / (warmup_epochs - 1)


@register_loss("ibot_loss")
class IBOTLoss(MaskedDistillationLoss):
    """iBOT's loss with its teacher and its two centers (see the module docstring).

    Args:
        teacher_momentum: the teacher's EMA factor at iteration 0 (a cosine to 1).
        warmup_teacher_temp: the [CLS] teacher temperature at epoch 0.
        teacher_temp: the [CLS] teacher temperature after the warm-up.
        warmup_teacher_patch_temp: the patch teacher temperature at epoch 0.
        teacher_patch_temp: the patch teacher temperature after the warm-up.
        warmup_teacher_temp_epochs: epochs of the linear warm-ups.
        student_temp: the student's temperature.
        center_momentum: EMA factor of the [CLS] center ``center``.
        center_momentum2: EMA factor of the patch center ``center2``.
        lambda1: weight of the [CLS] loss.
        lambda2: weight of the patch loss.
        mim_start_epoch: the patch temperature's warm-up starts at this epoch.
        num_global_crops: global crops per sample (from the transforms).
        num_local_crops: local crops per sample (from the transforms).
        out_dim: the head's [CLS] output width (from the ibot_head).
        patch_out_dim: the head's patch output width (from the ibot_head).
        num_epochs: the run's epochs (from OPTIMIZER.num_epochs; VISSL's schedule length).
    """

    Params = IBOTParams

    def __init__(
        self,
        teacher_momentum: float = IBOTParams.teacher_momentum,
        warmup_teacher_temp: float = IBOTParams.warmup_teacher_temp,
        teacher_temp: float = IBOTParams.teacher_temp,
        warmup_teacher_patch_temp: float = IBOTParams.warmup_teacher_patch_temp,
        teacher_patch_temp: float = IBOTParams.teacher_patch_temp,
        warmup_teacher_temp_epochs: int = IBOTParams.warmup_teacher_temp_epochs,
        student_temp: float = IBOTParams.student_temp,
        center_momentum: float = IBOTParams.center_momentum,
        center_momentum2: float = IBOTParams.center_momentum2,
        lambda1: float = IBOTParams.lambda1,
        lambda2: float = IBOTParams.lambda2,
        mim_start_epoch: int = IBOTParams.mim_start_epoch,
        num_global_crops: int = IBOTParams.num_global_crops,
        num_local_crops: int = IBOTParams.num_local_crops,
        out_dim: int = IBOTParams.out_dim,
        patch_out_dim: int = IBOTParams.patch_out_dim,
        num_epochs: int = IBOTParams.num_epochs,
    ) -> None:
        p = parse(
            IBOTParams,
            {
                "teacher_momentum": teacher_momentum,
                "warmup_teacher_temp": warmup_teacher_temp,
                "teacher_temp": teacher_temp,
                "warmup_teacher_patch_temp": warmup_teacher_patch_temp,
                "teacher_patch_temp": teacher_patch_temp,
                "warmup_teacher_temp_epochs": warmup_teacher_temp_epochs,
                "student_temp": student_temp,
                "center_momentum": center_momentum,
                "center_momentum2": center_momentum2,
                "lambda1": lambda1,
                "lambda2": lambda2,
                "mim_start_epoch": mim_start_epoch,
                "num_global_crops": num_global_crops,
                "num_local_crops": num_local_crops,
                "out_dim": out_dim,
                "patch_out_dim": patch_out_dim,
                "num_epochs": num_epochs,
            },
            _KEY,
        )
        super().__init__(p.teacher_momentum)
        self.warmup_teacher_temp = p.warmup_teacher_temp
        self.teacher_temp_final = p.teacher_temp
        self.warmup_teacher_patch_temp = p.warmup_teacher_patch_temp
        self.teacher_patch_temp_final = p.teacher_patch_temp
        self.warmup_teacher_temp_epochs = p.warmup_teacher_temp_epochs
        self.student_temp = p.student_temp
        self.center_momentum = p.center_momentum
        self.center_momentum2 = p.center_momentum2
        self.lambda1 = p.lambda1
        self.lambda2 = p.lambda2
        self.mim_start_epoch = p.mim_start_epoch
        self.num_global_crops = p.num_global_crops
        self.num_local_crops = p.num_local_crops
        self.out_dim = out_dim = p.out_dim
        self.patch_out_dim = patch_out_dim = p.patch_out_dim
        self.num_epochs = p.num_epochs
        if self.warmup_teacher_temp_epochs + self.mim_start_epoch > max(self.num_epochs, 1):
            logger.warning(
                "%s: warmup_teacher_temp_epochs (%d) + mim_start_epoch (%d) exceed num_epochs "
                "(%d): the temperatures never reach teacher_temp / teacher_patch_temp",
                _KEY,
                self.warmup_teacher_temp_epochs,
                self.mim_start_epoch,
                self.num_epochs,
            )
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.register_buffer("center2", torch.zeros(1, 1, patch_out_dim))
        self.center: torch.Tensor
        self.center2: torch.Tensor
        self.cls_centering = Center(self, "center", self.center_momentum)
        self.patch_centering = Center(self, "center2", self.center_momentum2)
        self.epoch = 0
        #: ``forward``'s teacher temperatures when none are passed (set_schedule_position)
        self.teacher_temp = self.warmup_teacher_temp
        self.teacher_patch_temp = self.warmup_teacher_patch_temp

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """VISSL's inference: the crops, the head's widths and ``num_epochs``; checks the
        collator, the inputs, the mapping, the trunk's masking and the mask's patch size.

        Raises:
            ConfigError: see :func:`~vissl.losses.self_distillation.infer_masked_distillation_config`.
        """
        infer_masked_distillation_config(params, config, _KEY)
        params["num_epochs"] = int(
            config["OPTIMIZER"].get("num_epochs", params.get("num_epochs", 10))
        )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> IBOTLoss:
        return cls(**vars(parse(IBOTParams, params, _KEY)))

    def schedule_inputs(self, step: TeacherStep) -> dict[str, Any]:
        """The temperatures of train phase ``step.epoch`` (iBOT's schedules are per epoch)."""
        return {
            "teacher_temp": ibot_temperature(
                step.epoch,
                self.warmup_teacher_temp,
                self.teacher_temp_final,
                self.warmup_teacher_temp_epochs,
            ),
            "teacher_patch_temp": ibot_temperature(
                step.epoch,
                self.warmup_teacher_patch_temp,
                self.teacher_patch_temp_final,
                self.warmup_teacher_temp_epochs,
                self.mim_start_epoch,
            ),
        }

    def set_schedule_position(self, iteration: int, epoch: int) -> None:
        """Make the temperatures of ``epoch`` the defaults of ``forward``."""
        super().set_schedule_position(iteration, epoch)
        self.epoch = epoch

    def forward(
        self,
        output: Any,
        target: Any,
        *,
        teacher_output: Any = None,
        teacher_temp: float | None = None,
        teacher_patch_temp: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss of the student's ``output`` against the teacher's.

        Args:
            output: the student's ``[[cls, patch], [local_cls]]``.
            target: the student's masks ``(G * B, h, w)``.
            teacher_output: the teacher's ``[cls, patch]`` on the unmasked global views.
            teacher_temp: the [CLS] teacher temperature (default: the loss's current).
            teacher_patch_temp: the patch teacher temperature (default: the current).
        """
        out = split_student_output(output, "ibot_loss")
        teacher = self.given_teacher_outputs(teacher_output, "ibot_loss")
        tau = self.teacher_temp if teacher_temp is None else float(teacher_temp)
        tau2 = self.teacher_patch_temp if teacher_patch_temp is None else teacher_patch_temp
        if not isinstance(target, torch.Tensor):
            raise ValueError(
                "ibot_loss expects the target to be the global views' masks: "
                "config.DATA.TRAIN.TARGET_KEY_NAMES: [mask]."
            )
        flat_mask = target.reshape(target.shape[0], -1).bool()
        check_batch_layout(
            out, teacher, flat_mask, self.num_global_crops, self.num_local_crops, "ibot_loss"
        )
        t_cls, t_patch = teacher[0].float(), teacher[1].float()
        if out.patch.ndim != 3 or t_patch.shape != out.patch.shape:
            raise ValueError(
                "ibot_loss centers the teacher's outputs over every patch: the ibot_head must "
                "score every patch (masked_patches_only: False); got student "
                f"{tuple(out.patch.shape)}, teacher {tuple(t_patch.shape)}."
            )
        g = self.num_global_crops
        cls_targets = self.cls_centering.apply(t_cls, tau).chunk(g)
        patch_targets = self.patch_centering.apply(t_patch, float(tau2))
        student_cls = list(out.cls.chunk(g))
        if out.local_cls is not None and self.num_local_crops:
            student_cls += list(out.local_cls.chunk(self.num_local_crops))
        cls_loss = pairwise_cls_cross_entropy(cls_targets, student_cls, self.student_temp)
        per_patch = soft_cross_entropy(patch_targets, out.patch, self.student_temp)
        weights = flat_mask.float()
        per_image = (per_patch * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        patch_loss = per_image.mean()  # the mean over each crop's images, then over crops
        cls_term = cls_loss * self.lambda1
        patch_term = patch_loss * self.lambda2
        if self.training:
            self.cls_centering.update(t_cls)
            self.patch_centering.update(t_patch.mean(dim=1))
        return {
            "loss": cls_term + patch_term,
            "cls": cls_term.detach(),
            "patch": patch_term.detach(),
        }

    def extra_repr(self) -> str:
        return (
            f"out_dim={self.out_dim}, patch_out_dim={self.patch_out_dim}, crops="
            f"{self.num_global_crops}+{self.num_local_crops}, teacher_momentum={self.momentum}, "
            f"teacher_temp=[{self.warmup_teacher_temp}, {self.teacher_temp_final}], "
            f"teacher_patch_temp=[{self.warmup_teacher_patch_temp}, "
            f"{self.teacher_patch_temp_final}] over {self.warmup_teacher_temp_epochs} epochs, "
            f"lambda1={self.lambda1}, lambda2={self.lambda2}"
        )
