"""``dinov2_loss``: DINOv2's pretraining loss (Oquab et al., *DINOv2: Learning Robust Visual
Features without Supervision*, TMLR 2024), keys named after the dinov2 repository.

The batch is iBOT's (``ibot_multicrop_masking_collator``): the student sees the masked
global crops and the local crops, the teacher (an EMA copy) the global crops unmasked.
With ``G`` global crops (``q``) and ``V`` crops in all (``v``)::

    P_t(q)  = teacher targets of the global [CLS] rows      (centering or Sinkhorn-Knopp)
    P_t(j)  = teacher targets of the masked patch rows j
    L_dino  = mean over (q, v != q) of mean_i  -sum P_t(q)_i log softmax(s_v,i / tau_s)
    L_ibot  = (1 / (G B)) sum over masked patches j of
                  (-sum P_t(j) log softmax(s_j / tau_s)) / n_masked(image of j)
    L_koleo = sum over global crops q of  -mean_i log(||x_q,i - x_q,nn(i)|| + eps)
    loss    = dino_loss_weight * L_dino + koleo_loss_weight * L_koleo
              + ibot_loss_weight * L_ibot

``x`` are the student's L2-normalised trunk class tokens of the global crops (the
``ibot_head`` returns them with ``output_cls_token``); KoLeo's nearest neighbours are
sought in this rank's batch only, as in DINOv2. An image without masked patches adds 0
to ``L_ibot``, whose mean is over every global crop's image.

The teacher's targets, one temperature ``tau_t`` for both (linear from
``warmup_teacher_temp`` to ``teacher_temp`` over ``warmup_teacher_temp_iters``
iterations, then constant):

- ``centering: centering``: ``softmax((t - center) / tau_t)``; after each training forward
  ``center`` (the [CLS] rows) and ``patch_center`` (the masked patch rows) follow the
  teacher's mean over the GLOBAL batch (every rank's rows, divided by the true count)
  with ``center_momentum``.
- ``centering: sinkhorn_knopp``: ``sinkhorn_knopp_iterations`` of Sinkhorn-Knopp on
  ``exp(t / tau_t)`` over the global batch: the [CLS] rows of every rank, and the masked
  patch rows of every rank, each with its all-reduced count (DINOv2 counts the [CLS] rows
  as rows x world size, the same with equal batches); the centers are not used.

Returns ``{"loss", "dino_loss", "koleo_loss", "ibot_loss"}`` (the unweighted parts are
logged as ``loss.dino_loss`` etc.).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from vissl.config.params import IntAtLeast, NonNegative, Note, OneOf, Positive, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.self_distillation import (
    MaskedDistillationLoss,
    check_batch_layout,
    infer_masked_distillation_config,
    koleo_loss,
    masked_rows,
    pairwise_cls_cross_entropy,
    sinkhorn_knopp_targets,
    soft_cross_entropy,
    split_student_output,
)
from vissl.models.center import Center
from vissl.models.momentum import TeacherStep
from vissl.utils.distributed import all_reduce_sum

_KEY = "config.LOSS.dinov2_loss"
CENTERINGS = ("centering", "sinkhorn_knopp")


@dataclass(kw_only=True, frozen=True)
class DINOv2Params:
    """``config.LOSS.dinov2_loss`` (DINOv2's values; the crops and the head's widths are
    derived from the rest of the config)."""

    momentum_teacher: Annotated[float, Unit] = 0.992
    final_momentum_teacher: Annotated[float, Unit] = 1.0
    student_temp: Annotated[float, Positive] = 0.1
    warmup_teacher_temp: Annotated[float, Positive] = 0.04
    teacher_temp: Annotated[float, Positive] = 0.07
    warmup_teacher_temp_iters: Annotated[int, IntAtLeast(0)] = 37500
    centering: Annotated[str, OneOf(*CENTERINGS), Note("DINOv2's train.centering")] = "centering"
    center_momentum: Annotated[float, Unit] = 0.9
    sinkhorn_knopp_iterations: Annotated[int, IntAtLeast(1)] = 3
    dino_loss_weight: Annotated[float, NonNegative] = 1.0
    koleo_loss_weight: Annotated[float, NonNegative, Note("0: off")] = 0.1
    ibot_loss_weight: Annotated[float, NonNegative] = 1.0
    num_global_crops: Annotated[int, IntAtLeast(1)] = 2
    num_local_crops: Annotated[int, IntAtLeast(0)] = 8
    out_dim: Annotated[int, IntAtLeast(1)] = 65536
    patch_out_dim: Annotated[int, IntAtLeast(1)] = 65536


def linear_warmup(iteration: int, start: float, end: float, warmup_iters: int) -> float:
    """``start`` to ``end`` linearly over ``warmup_iters`` iterations, then ``end`` (DINOv2's
    teacher temperature: a CosineScheduler whose base and final values are equal)."""
    if warmup_iters <= 0 or iteration >= warmup_iters:
        return end
    return start + (end - start) * iteration / warmup_iters


@register_loss("dinov2_loss")
class DINOv2Loss(MaskedDistillationLoss):
    """DINOv2's loss with its teacher and centers (see the module docstring).

    Args:
        momentum_teacher: the teacher's EMA factor at iteration 0 (DINOv2: 0.992).
        final_momentum_teacher: the EMA factor at the end (a cosine between them).
        student_temp: the student's temperature.
        warmup_teacher_temp: the teacher temperature at iteration 0.
        teacher_temp: the teacher temperature after the warm-up.
        warmup_teacher_temp_iters: iterations of the linear warm-up.
        centering: ``centering`` or ``sinkhorn_knopp``.
        center_momentum: EMA factor of the centers.
        sinkhorn_knopp_iterations: Sinkhorn-Knopp iterations.
        dino_loss_weight: weight of the [CLS] loss.
        koleo_loss_weight: weight of the KoLeo regulariser (0: off).
        ibot_loss_weight: weight of the masked patch loss.
        num_global_crops: global crops per sample (from the transforms).
        num_local_crops: local crops per sample (from the transforms).
        out_dim: the head's [CLS] output width (from the ibot_head).
        patch_out_dim: the head's patch output width (from the ibot_head).
    """

    Params = DINOv2Params

    def __init__(
        self,
        momentum_teacher: float = DINOv2Params.momentum_teacher,
        final_momentum_teacher: float = DINOv2Params.final_momentum_teacher,
        student_temp: float = DINOv2Params.student_temp,
        warmup_teacher_temp: float = DINOv2Params.warmup_teacher_temp,
        teacher_temp: float = DINOv2Params.teacher_temp,
        warmup_teacher_temp_iters: int = DINOv2Params.warmup_teacher_temp_iters,
        centering: str = DINOv2Params.centering,
        center_momentum: float = DINOv2Params.center_momentum,
        sinkhorn_knopp_iterations: int = DINOv2Params.sinkhorn_knopp_iterations,
        dino_loss_weight: float = DINOv2Params.dino_loss_weight,
        koleo_loss_weight: float = DINOv2Params.koleo_loss_weight,
        ibot_loss_weight: float = DINOv2Params.ibot_loss_weight,
        num_global_crops: int = DINOv2Params.num_global_crops,
        num_local_crops: int = DINOv2Params.num_local_crops,
        out_dim: int = DINOv2Params.out_dim,
        patch_out_dim: int = DINOv2Params.patch_out_dim,
    ) -> None:
        p = parse(
            DINOv2Params,
            {
                "momentum_teacher": momentum_teacher,
                "final_momentum_teacher": final_momentum_teacher,
                "student_temp": student_temp,
                "warmup_teacher_temp": warmup_teacher_temp,
                "teacher_temp": teacher_temp,
                "warmup_teacher_temp_iters": warmup_teacher_temp_iters,
                "centering": centering,
                "center_momentum": center_momentum,
                "sinkhorn_knopp_iterations": sinkhorn_knopp_iterations,
                "dino_loss_weight": dino_loss_weight,
                "koleo_loss_weight": koleo_loss_weight,
                "ibot_loss_weight": ibot_loss_weight,
                "num_global_crops": num_global_crops,
                "num_local_crops": num_local_crops,
                "out_dim": out_dim,
                "patch_out_dim": patch_out_dim,
            },
            _KEY,
        )
        super().__init__(p.momentum_teacher, p.final_momentum_teacher)
        self.student_temp = p.student_temp
        self.warmup_teacher_temp = p.warmup_teacher_temp
        self.teacher_temp_final = p.teacher_temp
        self.warmup_teacher_temp_iters = p.warmup_teacher_temp_iters
        self.centering = p.centering
        self.center_momentum = p.center_momentum
        self.sinkhorn_knopp_iterations = p.sinkhorn_knopp_iterations
        self.dino_loss_weight = p.dino_loss_weight
        self.koleo_loss_weight = p.koleo_loss_weight
        self.ibot_loss_weight = p.ibot_loss_weight
        self.num_global_crops = p.num_global_crops
        self.num_local_crops = p.num_local_crops
        self.out_dim = p.out_dim
        self.patch_out_dim = p.patch_out_dim
        self.register_buffer("center", torch.zeros(1, self.out_dim))
        self.register_buffer("patch_center", torch.zeros(1, self.patch_out_dim))
        self.center: torch.Tensor
        self.patch_center: torch.Tensor
        self.cls_centering = Center(self, "center", self.center_momentum)
        self.patch_centering = Center(self, "patch_center", self.center_momentum)
        #: ``forward``'s teacher temperature when none is passed (set_schedule_position)
        self.teacher_temp = self.warmup_teacher_temp

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """The crops and the head's widths; checks the batch, the mapping, the trunk's
        masking, the mask's patch size, and that KoLeo gets the trunk's class token.

        Raises:
            ConfigError: a setting that does not fit, naming its key.
        """
        head = infer_masked_distillation_config(params, config, _KEY)
        koleo = params.get("koleo_loss_weight", DINOv2Params.koleo_loss_weight)
        if (
            isinstance(koleo, int | float)
            and not isinstance(koleo, bool)
            and koleo > 0
            and not head.get("output_cls_token", False)
        ):
            raise ConfigError(
                f"{_KEY}.koleo_loss_weight is {koleo} but the ibot_head does not return the "
                'trunk\'s class token that KoLeo spreads: add "output_cls_token": True to '
                "its kwargs in config.MODEL.HEAD.PARAMS (or set koleo_loss_weight: 0).",
                "config.MODEL.HEAD.PARAMS",
            )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> DINOv2Loss:
        return cls(**vars(parse(DINOv2Params, params, _KEY)))

    def schedule_inputs(self, step: TeacherStep) -> dict[str, Any]:
        """The teacher temperature of ``step.iteration`` (DINOv2's schedules are per
        iteration)."""
        return {
            "teacher_temp": linear_warmup(
                step.iteration,
                self.warmup_teacher_temp,
                self.teacher_temp_final,
                self.warmup_teacher_temp_iters,
            )
        }

    def teacher_targets(
        self,
        t_cls: torch.Tensor,
        t_rows: torch.Tensor,
        num_masked: torch.Tensor,
        teacher_temp: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The [CLS] and masked patch targets (centering or Sinkhorn-Knopp)."""
        tau = self.teacher_temp if teacher_temp is None else float(teacher_temp)
        if self.centering == "sinkhorn_knopp":
            iters = self.sinkhorn_knopp_iterations
            # the global numbers of [CLS] and masked rows, in one all-reduce (DINOv2 takes
            # rows x world size for the [CLS] rows: the same with equal batches)
            counts = torch.stack(
                [num_masked.new_tensor(t_cls.shape[0]), num_masked.reshape(())]
            ).float()
            all_reduce_sum(counts)
            return (
                sinkhorn_knopp_targets(t_cls, tau, iters, num_samples=counts[0]),
                sinkhorn_knopp_targets(t_rows, tau, iters, num_samples=counts[1]),
            )
        cls_targets = self.cls_centering.apply(t_cls.float(), tau)
        patch_targets = self.patch_centering.apply(t_rows.float(), tau)
        return cls_targets, patch_targets

    def forward(
        self,
        output: Any,
        target: Any,
        *,
        teacher_output: Any = None,
        teacher_temp: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss of the student's ``output`` against the teacher's.

        Args:
            output: the student's ``[[cls, patch, cls_token], [local_cls]]``.
            target: the student's masks ``(G * B, h, w)``.
            teacher_output: the teacher's ``[cls, patch]`` on the unmasked global views.
            teacher_temp: the teacher temperature (default: the loss's current).
        """
        out = split_student_output(output, "dinov2_loss")
        teacher = self.given_teacher_outputs(teacher_output, "dinov2_loss")
        if not isinstance(target, torch.Tensor):
            raise ValueError(
                "dinov2_loss expects the target to be the global views' masks: "
                "config.DATA.TRAIN.TARGET_KEY_NAMES: [mask]."
            )
        flat_mask = target.reshape(target.shape[0], -1).bool()
        check_batch_layout(
            out, teacher, flat_mask, self.num_global_crops, self.num_local_crops, "dinov2_loss"
        )
        t_cls = teacher[0].float()
        t_rows = masked_rows(teacher[1], flat_mask).float()
        s_rows = masked_rows(out.patch, flat_mask)
        masked_per_image = flat_mask.sum(dim=1)
        if s_rows.shape[0] != t_rows.shape[0] or s_rows.ndim != 2:
            raise ValueError(
                f"dinov2_loss: {s_rows.shape[0]} student and {t_rows.shape[0]} teacher masked "
                "patch rows: both heads must score the same patches."
            )
        cls_targets, patch_targets = self.teacher_targets(
            t_cls, t_rows, masked_per_image.sum(), teacher_temp
        )
        g = self.num_global_crops
        student_cls = list(out.cls.chunk(g))
        if out.local_cls is not None and self.num_local_crops:
            student_cls += list(out.local_cls.chunk(self.num_local_crops))
        dino = pairwise_cls_cross_entropy(cls_targets.chunk(g), student_cls, self.student_temp)
        # each masked patch weighs 1 / (its image's masked patches); the sum over the
        # rows divided by the number of global-crop images
        row_weights = (
            (1.0 / masked_per_image.clamp(min=1).float())
            .unsqueeze(1)
            .expand_as(flat_mask)[flat_mask]
        )
        per_row = soft_cross_entropy(patch_targets, s_rows, self.student_temp)
        ibot = (per_row * row_weights).sum() / flat_mask.shape[0]
        koleo = dino.new_zeros(())
        if self.koleo_loss_weight > 0:
            if out.cls_token is None:
                raise ValueError(
                    "dinov2_loss: KoLeo needs the trunk's class token; give the ibot_head "
                    "output_cls_token: True."
                )
            for tokens in out.cls_token.chunk(g):
                koleo = koleo + koleo_loss(tokens)
        total = (
            self.dino_loss_weight * dino
            + self.koleo_loss_weight * koleo
            + self.ibot_loss_weight * ibot
        )
        if self.training and self.centering == "centering":
            self.cls_centering.update(t_cls)
            self.patch_centering.update(t_rows)
        return {
            "loss": total,
            "dino_loss": dino.detach(),
            "koleo_loss": koleo.detach(),
            "ibot_loss": ibot.detach(),
        }

    def extra_repr(self) -> str:
        return (
            f"out_dim={self.out_dim}, patch_out_dim={self.patch_out_dim}, crops="
            f"{self.num_global_crops}+{self.num_local_crops}, centering={self.centering}, "
            f"teacher_temp=[{self.warmup_teacher_temp}, {self.teacher_temp_final}] over "
            f"{self.warmup_teacher_temp_iters} iters, momentum_teacher={self.momentum} -> "
            f"{self.final_momentum}, weights dino={self.dino_loss_weight} "
            f"koleo={self.koleo_loss_weight} ibot={self.ibot_loss_weight}"
        )
