"""``dino_loss``: DINO's self-distillation with a momentum teacher and a centred target.

For a batch of ``B`` samples of ``num_crops`` crops each (crop-major, as the
``multicrop_collator`` lays them out), the student is the model being trained and the
teacher an EMA copy of it, run on the crops of ``crops_for_teacher`` only. With
``P_s(v) = softmax(s_v / student_temp)`` and ``P_t(c) = softmax((t_c - center) / tau_t)``::

    loss = mean over pairs (c in crops_for_teacher, v in crops, v != c) of
           mean_i  -sum_k P_t(c)_ik log P_s(v)_ik

``tau_t`` rises linearly from ``teacher_temp_min`` to ``teacher_temp_max`` over
``teacher_temp_warmup_iters`` iterations, then stays. After each training forward the
center follows the mean teacher output over the GLOBAL batch,
``center = ema_center * center + (1 - ema_center) * batch_mean``, where the mean is a sum
over every rank divided by the true number of rows (all-reduced), so ranks with unequal
batches are weighed correctly. The teacher's parameters follow the student's after every
optimizer step, ``teacher = m * teacher + (1 - m) * student``, with ``m`` on a cosine
from ``momentum`` to 1 over the whole training
(:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`).

The teacher is a separate module made once from the model (``bind_model``, before DDP
wraps or ``torch.compile`` compiles the student), with no gradients, never given to the
optimizer. It runs in eval mode (no dropout or drop path) except its BatchNorm layers,
which use the batch statistics as DINO's teacher does. The teacher and the center are in
the loss's ``state_dict``, hence in checkpoints, and resume exactly.

The loss takes what it needs as arguments, so it runs without the trainer::

    loss = DINOLoss(output_dim=K, num_crops=V, crops_for_teacher=[0, 1])
    value = loss(student_logits, teacher_output=teacher_logits, teacher_temp=0.04)

``teacher_logits`` are the teacher's on the crops of ``crops_for_teacher``, crop-major.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from vissl.config.params import IntAtLeast, Positive, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import find_head_params, transform_num_crops
from vissl.losses.self_distillation import SelfDistillationLoss, pairwise_cls_cross_entropy
from vissl.models.center import Center
from vissl.models.momentum import TeacherStep
from vissl.models.momentum import cosine_momentum as cosine_momentum  # re-export
from vissl.models.momentum import set_teacher_mode as set_teacher_mode  # re-export

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.dino_loss"


@dataclass(kw_only=True, frozen=True)
class DINOParams:
    """``config.LOSS.dino_loss`` (DINO's values; ``output_dim`` and ``num_crops`` are
    derived from the head and the transforms)."""

    momentum: Annotated[float, Unit] = 0.996
    student_temp: Annotated[float, Positive] = 0.1
    teacher_temp_min: Annotated[float, Positive] = 0.04
    teacher_temp_max: Annotated[float, Positive] = 0.07
    teacher_temp_warmup_iters: Annotated[int, IntAtLeast(0)] = 37530
    crops_for_teacher: Sequence[Any] = (0, 1)
    ema_center: Annotated[float, Unit] = 0.9
    normalize_last_layer: bool = True
    output_dim: Annotated[int, IntAtLeast(1)] = 65536
    num_crops: Annotated[int, IntAtLeast(2)] = 2

    def check(self, key_path: str) -> None:
        crops = list(self.crops_for_teacher)
        if (
            not crops
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in crops)
            or len(set(crops)) != len(crops)
            or not all(0 <= c < self.num_crops for c in crops)
        ):
            raise ConfigError(
                f"{key_path}.crops_for_teacher must list distinct crop indices in "
                f"[0, {self.num_crops - 1}] (the batch has {self.num_crops} crops per "
                f"sample), e.g. [0, 1] for the two global crops; got {crops!r}.",
                f"{key_path}.crops_for_teacher",
            )


def teacher_temperature(iteration: int, temp_min: float, temp_max: float, warmup: int) -> float:
    """DINO's teacher temperature: linear from ``temp_min`` to ``temp_max`` over ``warmup``."""
    if warmup <= 0 or iteration >= warmup:
        return temp_max
    return temp_min + (temp_max - temp_min) * iteration / warmup


def single_tensor(output: Any, what: str) -> torch.Tensor:
    """The one tensor of a model output (a tensor, or lists of one element around it)."""
    while not isinstance(output, torch.Tensor):
        items = list(output)
        if len(items) != 1:
            raise ValueError(
                f"dino_loss expects one output tensor from {what} (one head chain ending in "
                f"a dino_head), got {len(items)} outputs."
            )
        output = items[0]
    return output


@register_loss("dino_loss")
class DINOLoss(SelfDistillationLoss):
    """DINO loss with its teacher and center (see the module docstring).

    Args:
        momentum: the teacher's EMA factor at the start of training (cosine to 1).
        student_temp: the student's softmax temperature.
        teacher_temp_min: the teacher's temperature at iteration 0.
        teacher_temp_max: the teacher's temperature after the warm-up.
        teacher_temp_warmup_iters: iterations of the linear temperature warm-up.
        crops_for_teacher: indices of the crops the teacher sees (the global crops).
        ema_center: EMA factor of the center.
        normalize_last_layer: must match the dino_head's setting (checked from config).
        output_dim: width of the head's output (the center's size).
        num_crops: crops per sample in the batch.
    """

    Params = DINOParams

    def __init__(
        self,
        momentum: float = DINOParams.momentum,
        student_temp: float = DINOParams.student_temp,
        teacher_temp_min: float = DINOParams.teacher_temp_min,
        teacher_temp_max: float = DINOParams.teacher_temp_max,
        teacher_temp_warmup_iters: int = DINOParams.teacher_temp_warmup_iters,
        crops_for_teacher: Sequence[int] = DINOParams.crops_for_teacher,
        ema_center: float = DINOParams.ema_center,
        normalize_last_layer: bool = DINOParams.normalize_last_layer,
        output_dim: int = DINOParams.output_dim,
        num_crops: int = DINOParams.num_crops,
    ) -> None:
        p = parse(
            DINOParams,
            {
                "momentum": momentum,
                "student_temp": student_temp,
                "teacher_temp_min": teacher_temp_min,
                "teacher_temp_max": teacher_temp_max,
                "teacher_temp_warmup_iters": teacher_temp_warmup_iters,
                "crops_for_teacher": crops_for_teacher,
                "ema_center": ema_center,
                "normalize_last_layer": normalize_last_layer,
                "output_dim": output_dim,
                "num_crops": num_crops,
            },
            _KEY,
        )
        super().__init__(p.momentum)
        self.student_temp = p.student_temp
        self.teacher_temp_min = p.teacher_temp_min
        self.teacher_temp_max = p.teacher_temp_max
        self.teacher_temp_warmup_iters = p.teacher_temp_warmup_iters
        self.ema_center = p.ema_center
        self.normalize_last_layer = p.normalize_last_layer
        self.output_dim = p.output_dim
        self.num_crops = p.num_crops
        self.crops_for_teacher = list(p.crops_for_teacher)
        self.register_buffer("center", torch.zeros(1, self.output_dim))
        self.center: torch.Tensor
        #: the EMA of the teacher's outputs (DINO's in-place form, see Center)
        self.centering = Center(self, "center", self.ema_center, "scale_add")
        #: ``forward``'s teacher temperature when none is passed
        self.teacher_temp = self.teacher_temp_min

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``num_crops`` from the transforms, ``output_dim`` from the dino_head.

        Raises:
            ConfigError: the collator is not ``multicrop_collator``, or the loss and the
                head disagree on ``normalize_last_layer``.
        """
        data = config["DATA"]["TRAIN"]
        collator = data.get("COLLATE_FUNCTION")
        if collator != "multicrop_collator":
            raise ConfigError(
                f"{_KEY}: DINO needs config.DATA.TRAIN.COLLATE_FUNCTION: multicrop_collator "
                f"(the crops of each sample, crop-major, possibly of several sizes); got "
                f"{collator!r}.",
                "config.DATA.TRAIN.COLLATE_FUNCTION",
            )
        crops = transform_num_crops(data.get("TRANSFORMS", []))
        if crops is not None:
            params["num_crops"] = crops
        head = find_head_params(config["MODEL"]["HEAD"].get("PARAMS", []), "dino_head")
        if head is None:
            return
        if "num_clusters" in head:
            from vissl.models.heads.dino_head import dino_output_dim

            out = dino_output_dim(head["num_clusters"])
            if params.get("output_dim") != out:
                logger.info("%s.output_dim set to %d, the dino_head's num_clusters", _KEY, out)
            params["output_dim"] = out
        from vissl.models.heads.dino_head import DINOHeadParams

        head_norm = head.get("normalize_last_layer", DINOHeadParams.normalize_last_layer)
        loss_norm = params.get("normalize_last_layer", DINOParams.normalize_last_layer)
        if bool(head_norm) != bool(loss_norm):
            raise ConfigError(
                f"{_KEY}.normalize_last_layer is {loss_norm} but the dino_head in "
                f"config.MODEL.HEAD.PARAMS has normalize_last_layer: {head_norm}; set both "
                "to the same value.",
                f"{_KEY}.normalize_last_layer",
            )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> DINOLoss:
        return cls(**vars(parse(DINOParams, params, _KEY)))

    #: how to leave a collapse (MomentumTeacherHook's warning at ln(output_dim))
    collapse_hint = (
        "Try a lower teacher temperature (LOSS.dino_loss.teacher_temp_max), a higher center "
        "momentum (LOSS.dino_loss.ema_center), a lower learning rate or a longer warm-up."
    )

    def teacher_temp_at(self, iteration: int) -> float:
        """The teacher temperature after ``iteration`` optimizer steps."""
        return teacher_temperature(
            iteration, self.teacher_temp_min, self.teacher_temp_max, self.teacher_temp_warmup_iters
        )

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The teacher's output on the crops of ``crops_for_teacher`` and the temperature."""
        teacher = self.momentum_teacher
        assert teacher is not None
        out = teacher(self.teacher_input(sample["input"]))
        return {
            "teacher_output": single_tensor(out, "the teacher"),
            "teacher_temp": self.teacher_temp_at(step.iteration),
        }

    @property
    def uniform_loss(self) -> float:
        """``ln(output_dim)``: the loss when teacher and student are uniform (collapse)."""
        return math.log(self.output_dim)

    def teacher_input(self, batch: Any) -> Any:
        """The crops of ``crops_for_teacher`` from a multi-crop batch (a list per crop)."""
        if isinstance(batch, torch.Tensor):
            raise ValueError(
                "dino_loss: the batch is one tensor, but the teacher needs the crops one by "
                "one; use config.DATA.TRAIN.COLLATE_FUNCTION: multicrop_collator."
            )
        crops = list(batch)
        if len(crops) != self.num_crops:
            raise ValueError(
                f"dino_loss expects {self.num_crops} crops per sample ({_KEY}.num_crops), the "
                f"batch has {len(crops)}."
            )
        return [crops[c] for c in self.crops_for_teacher]

    def update_center(self, teacher_output: torch.Tensor) -> None:
        """EMA of the center towards the mean teacher row over every rank's rows."""
        self.centering.update(teacher_output.float())

    def forward(
        self,
        output: Any,
        target: Any = None,
        *,
        teacher_output: torch.Tensor | None = None,
        teacher_temp: float | None = None,
    ) -> torch.Tensor:
        """Cross entropy of the student's crops against the teacher's; ``target`` unused.

        Args:
            output: the student's logits ``(num_crops * B, output_dim)`` (or a list of it).
            target: unused.
            teacher_output: the teacher's logits on the crops of ``crops_for_teacher``,
                ``(len(crops_for_teacher) * B, output_dim)``, crop-major.
            teacher_temp: the teacher temperature (default: ``teacher_temp_min``).
        """
        output = single_tensor(output, "the model")
        if output.ndim != 2 or output.shape[1] != self.output_dim:
            raise ConfigError(
                f"{_KEY}.output_dim is {self.output_dim} but the model outputs shape "
                f"{tuple(output.shape)}; set it to the dino_head's num_clusters.",
                f"{_KEY}.output_dim",
            )
        teacher = self.given_teacher_output(teacher_output, "dino_loss")
        if output.shape[0] % self.num_crops != 0:
            raise ValueError(
                f"dino_loss: {output.shape[0]} rows are not {self.num_crops} crops of one batch."
            )
        batch = output.shape[0] // self.num_crops
        n_teacher = len(self.crops_for_teacher)
        if teacher.shape != (n_teacher * batch, self.output_dim):
            raise ValueError(
                f"dino_loss: teacher output of shape {tuple(teacher.shape)} for {n_teacher} "
                f"crops of {batch} samples."
            )
        teacher = teacher.detach().float()
        tau = self.teacher_temp if teacher_temp is None else float(teacher_temp)
        targets = self.centering.apply(teacher, tau).chunk(n_teacher)
        loss = pairwise_cls_cross_entropy(
            targets,
            output.float().chunk(self.num_crops),
            self.student_temp,
            self.crops_for_teacher,
        )
        if self.training:
            self.update_center(teacher)
        return loss

    def extra_repr(self) -> str:
        return (
            f"output_dim={self.output_dim}, num_crops={self.num_crops}, "
            f"crops_for_teacher={self.crops_for_teacher}, momentum={self.momentum}, "
            f"student_temp={self.student_temp}, teacher_temp=[{self.teacher_temp_min}, "
            f"{self.teacher_temp_max}] over {self.teacher_temp_warmup_iters} iters, "
            f"ema_center={self.ema_center}"
        )
