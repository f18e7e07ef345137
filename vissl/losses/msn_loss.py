"""``msn_loss``: Masked Siamese Networks (Assran et al., *Masked Siamese Networks for
Label-Efficient Learning*, ECCV 2022), VISSL's name and keys.

Each image gives a target view and ``M`` anchor views (``msn_collator``): ``R`` views of the
target's size, their patches masked at random (the ViT encodes the visible patches only,
``MASKED_IMAGE_MODELING.NAME: mae``), and ``F`` focal views (small crops: MSN's focal
masking), seen whole as in MSN's code (masking them too is an ablation: their masks reach
the trunk as ``focal_mask``). VISSL's layout works too: ``multicrop_collator`` (crop 0 the target, the
model encoding every crop; the loss drops its crop-0 rows) with the trunk dropping the
patches itself (``MASKED_IMAGE_MODELING.NAME: msn``). The model (``msn_head``) maps each
anchor to its cosine similarities with the L2-normalised prototypes; the target encoder,
an EMA copy of the model using the model's prototypes, does the same for the unmasked
target view. For image ``i`` and anchor view
``m``, with ``K`` prototypes and label smoothing ``s``::

    p_i,m   = (1 - s) softmax(cos(z_i,m, prototypes) / tau) + s / K        # anchor
    q_i     = (1 - s) softmax(cos(z+_i, prototypes) / tau) + s / K         # target
    p+_i    = q_i ** (tau / tau+) / sum_k q_i,k ** (tau / tau+)            # sharpened
              (= softmax(cos(z+_i) / tau+) when s = 0); optionally Sinkhorn-Knopp over
              the GLOBAL batch (``use_sinkhorn``, 3 iterations)
    CE      = mean over (i, m) of  -sum_k p+_i,k log p_i,m,k
    p_bar   = mean over every anchor of the GLOBAL batch (all ranks) of p_i,m
    me_max  = log K - H(p_bar),   H(p) = -sum_k p_k log p_k      (>= 0, 0 when uniform)
    ent     = mean over (i, m) of H(p_i,m)
    loss    = CE + me_max_weight * me_max + entropy_weight * ent

``tau`` is ``temperature`` (0.1), ``tau+`` is ``target_temperature`` (0.025: MSN's
sharpening ``T = 0.25``). The mean-entropy maximisation regulariser pushes the average
prediction over the global batch towards uniform use of the prototypes (its gradient
reaches every rank's anchors). The target encoder follows the model by an EMA whose
factor goes from ``momentum`` to 1 by a cosine; its prototypes are set to the model's
before each forward (MSN shares them between the branches).

Returns ``{"loss", "ce", "me_max", "entropy"}`` (the weighted terms are logged as
``loss.ce``, ``loss.me_max`` and ``loss.entropy``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import IntAtLeast, NonNegative, Positive, Unit, UnitOpen, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import find_head_params
from vissl.losses.self_distillation import MaskedDistillationLoss
from vissl.losses.swav_common import distributed_sinkhorn
from vissl.models.momentum import TeacherStep
from vissl.utils.distributed import all_reduce_sum, all_reduce_sum_with_grad

if TYPE_CHECKING:
    from vissl.models.heads.msn_head import MSNHead

__all__ = ["MSNLoss", "msn_anchor_log_probs", "msn_targets"]

_KEY = "config.LOSS.msn_loss"
COLLATOR = "msn_collator"
VISSL_COLLATOR = "multicrop_collator"
TARGET_VIEWS = "target_views"
ANCHOR_VIEWS = "anchor_views"
FOCAL_VIEWS = "focal_views"
MASK = "mask"
FOCAL_MASK = "focal_mask"


@dataclass(kw_only=True, frozen=True)
class MSNParams:
    """``config.LOSS.msn_loss`` (MSN's values; ``output_dim`` is derived from the
    msn_head's ``num_prototypes``)."""

    momentum: Annotated[float, Unit] = 0.996
    temperature: Annotated[float, Positive] = 0.1
    target_temperature: Annotated[float, Positive] = 0.025
    me_max_weight: Annotated[float, NonNegative] = 1.0
    entropy_weight: Annotated[float, NonNegative] = 0.0
    use_sinkhorn: bool = True
    sinkhorn_iterations: Annotated[int, IntAtLeast(1)] = 3
    label_smoothing: Annotated[float, UnitOpen] = 0.0
    output_dim: Annotated[int, IntAtLeast(1)] = 1024


def _smoothed_log_probs(logits: torch.Tensor, smoothing: float) -> torch.Tensor:
    """``log((1 - s) softmax(logits) + s / K)`` per row, stable for any ``s``."""
    log_p = F.log_softmax(logits, dim=-1)
    if smoothing <= 0:
        return log_p
    floor = math.log(smoothing / logits.shape[-1])
    return torch.logaddexp(log_p + math.log1p(-smoothing), torch.full_like(log_p, floor))


def msn_anchor_log_probs(
    cosines: torch.Tensor, temperature: float, label_smoothing: float = 0.0
) -> torch.Tensor:
    """``log p``: the anchors' log predictions (float32) from their prototype cosines."""
    return _smoothed_log_probs(cosines.float() / temperature, label_smoothing)


@torch.no_grad()
def msn_targets(
    cosines: torch.Tensor,
    temperature: float,
    target_temperature: float,
    label_smoothing: float = 0.0,
    use_sinkhorn: bool = False,
    sinkhorn_iterations: int = 3,
) -> torch.Tensor:
    """``p+``: the target views' sharpened predictions, rows summing to 1 (float32).

    ``q ** (tau / tau+)`` renormalised, ``q`` the target's smoothed prediction at ``tau``;
    with ``use_sinkhorn`` the sharpened rows then go through Sinkhorn-Knopp over the
    global batch (MSN applies it to the sharpened probabilities: epsilon 1 on their logs).
    """
    log_q = _smoothed_log_probs(cosines.float() / temperature, label_smoothing)
    sharpened = torch.softmax(log_q * (temperature / target_temperature), dim=-1)
    if not use_sinkhorn:
        return sharpened
    return distributed_sinkhorn(
        torch.log_softmax(log_q * (temperature / target_temperature), dim=-1),
        1.0,
        sinkhorn_iterations,
    )


def _heads(model: nn.Module) -> list[MSNHead]:
    from vissl.models.heads.msn_head import MSNHead

    return [m for m in model.modules() if isinstance(m, MSNHead)]


def _masks_focal_crops(transforms: Any) -> bool | None:
    """Whether the masking transforms mask a focal crop (a crop after the first, largest,
    ``ImgPilToMultiCrop`` group); None when the crops cannot be read from the config."""
    groups = None
    for t in transforms or []:
        if isinstance(t, Mapping) and t.get("name") == "ImgPilToMultiCrop":
            sizes, counts = list(t.get("size_crops") or []), list(t.get("num_crops") or [])
            if sizes and len(sizes) == len(counts) and sizes[0] == max(sizes):
                groups = counts
    if groups is None:
        return None
    large = int(groups[0])
    for t in transforms:
        if isinstance(t, Mapping) and t.get("name") == "RandomPatchMasking":
            indices = t.get("indices")
            if indices is None or any(int(k) >= large for k in indices):
                return True
    return False


def _check_focal_masking(data: Mapping[str, Any], inputs: list[str], mapping: list[Any]) -> None:
    """MSN masks the anchor views only; masking the focal views too (an ablation) needs
    their masks in INPUT_KEY_NAMES and mapped to the trunk, or they would go unused."""
    focal = next((e for e in mapping if len(e) == 2 and e[0] == FOCAL_VIEWS), None)
    extra = focal[1].get("additional_keys") if focal is not None else None
    mapped = isinstance(extra, Mapping) and extra.get(MASK) == FOCAL_MASK
    listed = FOCAL_MASK in inputs
    masked = _masks_focal_crops(data.get("TRANSFORMS"))
    how = (
        "MSN masks the anchor views only (RandomPatchMasking indices [1, ..., R]); to mask "
        "the focal views too (an ablation) give RandomPatchMasking their indices, list "
        f"{FOCAL_MASK} in config.DATA.TRAIN.INPUT_KEY_NAMES and map it to the trunk: "
        '["focal_views", {"feat_names": ["lastCLS"], "additional_keys": {"mask": '
        '"focal_mask"}}].'
    )
    if listed != mapped:
        raise ConfigError(
            f"{_KEY}: {FOCAL_MASK} is {'' if listed else 'not '}in "
            "config.DATA.TRAIN.INPUT_KEY_NAMES but the focal_views entry of "
            f"config.MODEL.MULTI_INPUT_HEAD_MAPPING {'does not pass' if listed else 'passes'} "
            f"it to the trunk: {how}",
            "config.MODEL.MULTI_INPUT_HEAD_MAPPING",
        )
    if masked is not None and masked != listed:
        detail = (
            f"masks focal crops, but {FOCAL_MASK} is not in INPUT_KEY_NAMES (their masks "
            "would not be used)"
            if masked
            else f"masks no focal crop, but {FOCAL_MASK} is in INPUT_KEY_NAMES (the batch has none)"
        )
        raise ConfigError(
            f"{_KEY}: the RandomPatchMasking of config.DATA.TRAIN.TRANSFORMS {detail}: {how}",
            "config.DATA.TRAIN.TRANSFORMS",
        )


@register_loss("msn_loss")
class MSNLoss(MaskedDistillationLoss):
    """MSN's loss with its target encoder (see the module docstring).

    Args:
        momentum: the target encoder's EMA factor at iteration 0 (a cosine to 1; MSN 0.996).
        temperature: the anchors' temperature ``tau`` (MSN: 0.1).
        target_temperature: the targets' temperature ``tau+`` (MSN: 0.025).
        me_max_weight: weight of the mean-entropy maximisation term (MSN: 1.0; 0 disables).
        entropy_weight: weight of the mean per-anchor entropy (MSN's ``ent_weight``: 0.0).
        use_sinkhorn: Sinkhorn-Knopp on the targets over the global batch (MSN: true).
        sinkhorn_iterations: its iterations (MSN: 3).
        label_smoothing: MSN's label smoothing of the prototype labels (0.0).
        output_dim: the number of prototypes (inferred from the msn_head).
    """

    Params = MSNParams

    def __init__(
        self,
        momentum: float = MSNParams.momentum,
        temperature: float = MSNParams.temperature,
        target_temperature: float = MSNParams.target_temperature,
        me_max_weight: float = MSNParams.me_max_weight,
        entropy_weight: float = MSNParams.entropy_weight,
        use_sinkhorn: bool = MSNParams.use_sinkhorn,
        sinkhorn_iterations: int = MSNParams.sinkhorn_iterations,
        label_smoothing: float = MSNParams.label_smoothing,
        output_dim: int = MSNParams.output_dim,
    ) -> None:
        p = parse(
            MSNParams,
            {
                "momentum": momentum,
                "temperature": temperature,
                "target_temperature": target_temperature,
                "me_max_weight": me_max_weight,
                "entropy_weight": entropy_weight,
                "use_sinkhorn": use_sinkhorn,
                "sinkhorn_iterations": sinkhorn_iterations,
                "label_smoothing": label_smoothing,
                "output_dim": output_dim,
            },
            _KEY,
        )
        super().__init__(p.momentum)
        self.temperature = p.temperature
        self.target_temperature = p.target_temperature
        self.me_max_weight = p.me_max_weight
        self.entropy_weight = p.entropy_weight
        self.use_sinkhorn = p.use_sinkhorn
        self.sinkhorn_iterations = p.sinkhorn_iterations
        self.label_smoothing = p.label_smoothing
        self.output_dim = p.output_dim
        #: (model head, target head) pairs whose prototypes are shared (set by bind_model)
        self._prototype_pairs: list[tuple[MSNHead, MSNHead]] = []

    # ------------------------------------------------------------------ config
    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``output_dim`` from the msn_head; checks the collator, the inputs, the mapping,
        the trunk's masking, the masks' patch size and VISSL's head keys.

        Two layouts: ours (``msn_collator``, the views by name, the masks from the data)
        and VISSL's (``multicrop_collator``, crop 0 the target, the trunk drops patches
        itself: ``MASKED_IMAGE_MODELING.NAME: msn``).

        Raises:
            ConfigError: naming the key that does not fit MSN.
        """
        data = config["DATA"]["TRAIN"]
        model = config["MODEL"]
        trunk = model.get("TRUNK", {})
        vit = trunk.get("VISION_TRANSFORMERS", {}) or {}
        mim = (vit.get("MASKED_IMAGE_MODELING") or {}).get("NAME", "")
        collator = data.get("COLLATE_FUNCTION")
        if collator == VISSL_COLLATOR and mim == "msn":
            cls._check_vissl_layout(data, model)
        else:
            cls._check_layout(data, model, collator, trunk, mim)
        head = find_head_params(model.get("HEAD", {}).get("PARAMS", []), "msn_head")
        if head is None:
            raise ConfigError(
                f"{_KEY}: config.MODEL.HEAD.PARAMS must hold an msn_head (its prototype "
                "scores are what the loss compares).",
                "config.MODEL.HEAD.PARAMS",
            )
        for key in ("temperature", "label_smoothing"):
            value = head.get(key)
            if value is not None and value != params.get(key, getattr(MSNParams, key)):
                raise ConfigError(
                    f"config.MODEL.HEAD.PARAMS: the msn_head's {key} (VISSL's head key) is "
                    f"{value} but {_KEY}.{key} is {params.get(key, getattr(MSNParams, key))}: the loss "
                    f"applies it here; set {_KEY}.{key}: {value} (or drop the head's key).",
                    f"{_KEY}.{key}",
                )
        from vissl.models.heads.msn_head import MSNHeadParams

        params["output_dim"] = head.get("num_prototypes", MSNHeadParams.num_prototypes)

    @staticmethod
    def _check_layout(
        data: Mapping[str, Any],
        model: Mapping[str, Any],
        collator: Any,
        trunk: Mapping[str, Any],
        mim: str,
    ) -> None:
        """Ours: msn_collator, the named views, the masks from RandomPatchMasking."""
        if collator != COLLATOR:
            raise ConfigError(
                f"{_KEY}: needs config.DATA.TRAIN.COLLATE_FUNCTION: {COLLATOR} (the target "
                f"view, the masked anchor views, the focal views), or VISSL's layout "
                f"({VISSL_COLLATOR} with the trunk's MASKED_IMAGE_MODELING.NAME: msn); got "
                f"{collator!r}.",
                "config.DATA.TRAIN.COLLATE_FUNCTION",
            )
        inputs = list(data.get("INPUT_KEY_NAMES") or [])
        if not {TARGET_VIEWS, ANCHOR_VIEWS, MASK} <= set(inputs):
            raise ConfigError(
                f"{_KEY}: config.DATA.TRAIN.INPUT_KEY_NAMES must list {TARGET_VIEWS}, "
                f"{ANCHOR_VIEWS}, {MASK} (and {FOCAL_VIEWS} with focal crops), "
                f"e.g. [target_views, anchor_views, focal_views, mask]; got "
                f"{inputs}.",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        mapping = list(model.get("MULTI_INPUT_HEAD_MAPPING") or [])
        keys = [entry[0] for entry in mapping if len(entry) == 2]
        first = mapping[0] if mapping else None
        ok = (
            first is not None
            and len(first) == 2
            and first[0] == ANCHOR_VIEWS
            and isinstance(first[1], Mapping)
            and MASK in list(first[1].get("additional_keys") or [])
            and TARGET_VIEWS not in keys
            and set(keys) <= {ANCHOR_VIEWS, FOCAL_VIEWS}
        )
        if not ok:
            raise ConfigError(
                f"{_KEY}: config.MODEL.MULTI_INPUT_HEAD_MAPPING must be "
                '[["anchor_views", {"feat_names": ["lastCLS"], "additional_keys": ["mask"]}], '
                '["focal_views", {"feat_names": ["lastCLS"]}]] (the second entry with focal '
                "crops only): the model encodes the masked anchors and the focal views; the "
                f"target view goes to the target encoder only. Got {mapping}.",
                "config.MODEL.MULTI_INPUT_HEAD_MAPPING",
            )
        _check_focal_masking(data, inputs, mapping)
        if trunk.get("NAME") != "vision_transformer" or mim not in ("mae", "msn"):
            raise ConfigError(
                f"{_KEY}: the trunk must be vision_transformer with "
                "MASKED_IMAGE_MODELING.NAME: mae (the anchors' masked patches are dropped: the "
                f"ViT sees the visible ones only); got trunk {trunk.get('NAME')!r} with NAME "
                f"{mim!r}.",
                "config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME",
            )
        patch = (trunk.get("VISION_TRANSFORMERS", {}) or {}).get("PATCH_SIZE", 16)
        for i, t in enumerate(data.get("TRANSFORMS") or []):
            name = t.get("name") if isinstance(t, Mapping) else None
            if name == "RandomPatchMasking" and t.get("patch_size", 16) != patch:
                raise ConfigError(
                    f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size is "
                    f"{t.get('patch_size', 16)} but the trunk's PATCH_SIZE is {patch}: the "
                    "masks must be over the trunk's patch grid; set them equal.",
                    f"config.DATA.TRAIN.TRANSFORMS[{i}].patch_size",
                )

    @staticmethod
    def _check_vissl_layout(data: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        """VISSL's: multicrop_collator, crop 0 the target, the trunk drops the patches."""
        inputs = list(data.get("INPUT_KEY_NAMES") or ["data"])
        if len(inputs) != 1 or model.get("MULTI_INPUT_HEAD_MAPPING"):
            raise ConfigError(
                f"{_KEY}: with {VISSL_COLLATOR} (VISSL's MSN layout: crop 0 is the target "
                "view, the other crops the anchors) the model takes the crops as one input: "
                "leave config.DATA.TRAIN.INPUT_KEY_NAMES at [data] and "
                f"config.MODEL.MULTI_INPUT_HEAD_MAPPING empty (got {inputs} and "
                f"{model.get('MULTI_INPUT_HEAD_MAPPING')}), or use {COLLATOR}.",
                "config.MODEL.MULTI_INPUT_HEAD_MAPPING",
            )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> MSNLoss:
        return cls(**vars(parse(MSNParams, params, _KEY)))

    # ------------------------------------------------------------------ target encoder
    def bind_model(self, model: nn.Module) -> None:
        """The target encoder: an EMA copy of ``model``; its msn_head prototypes are paired
        with the model's (set equal before each target forward)."""
        super().bind_model(model)
        assert self.teacher is not None
        student, target = _heads(model), _heads(self.teacher)
        if not student:
            raise ConfigError(
                f"{_KEY}: the model has no msn_head; add one to config.MODEL.HEAD.PARAMS.",
                "config.MODEL.HEAD.PARAMS",
            )
        self._prototype_pairs = list(zip(student, target, strict=True))

    @torch.no_grad()
    def sync_prototypes(self) -> None:
        """Set the target encoder's prototypes to the model's (MSN shares them)."""
        for student, target in self._prototype_pairs:
            target.prototypes.copy_(student.prototypes)

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The target encoder's scores and, in VISSL's layout, how many of the model's
        output rows are the target crop's (``forward`` drops them)."""
        inputs = sample["input"]
        rows = 0
        if isinstance(inputs, list | tuple) and inputs and isinstance(inputs[0], torch.Tensor):
            rows = int(inputs[0].shape[0])
        return {"teacher_output": self.run_teacher(inputs), "target_rows": rows}

    def run_teacher(self, inputs: Any) -> list[torch.Tensor]:
        """The target encoder's prototype cosines on the whole target views: ``inputs``
        is msn_collator's batch, or (VISSL's layout) the list of crops, crop 0 the target."""
        assert self.teacher is not None
        self.sync_prototypes()
        if isinstance(inputs, list | tuple) and inputs and isinstance(inputs[0], torch.Tensor):
            # VISSL's layout: the model also encodes crop 0; forward drops its rows
            out = self.teacher(inputs[0])
            return [out[0] if isinstance(out, list | tuple) else out]
        if not isinstance(inputs, Mapping) or TARGET_VIEWS not in inputs:
            raise ValueError(
                f"msn_loss's target encoder expects the inputs of {COLLATOR} "
                f"({{{TARGET_VIEWS!r}, {ANCHOR_VIEWS!r}, ...}}) or of {VISSL_COLLATOR} (a "
                f"list of crops); got {type(inputs).__name__}"
                + (f" with keys {sorted(inputs)}" if isinstance(inputs, Mapping) else "")
                + "."
            )
        head_for_input = getattr(self.teacher, "head_for_input", None)
        if not callable(head_for_input):
            raise ValueError(
                "msn_loss's target encoder is not a multi_input_output_model with "
                "MULTI_INPUT_HEAD_MAPPING."
            )
        feature_names, head = head_for_input(ANCHOR_VIEWS)
        feats = self.teacher.trunk(inputs[TARGET_VIEWS], feature_names)  # type: ignore[operator]
        feats = [feats] if isinstance(feats, torch.Tensor) else list(feats)
        if len(feats) != 1:
            raise ValueError(
                f"msn_loss's target encoder got {len(feats)} trunk features; map one "
                "(lastCLS) to anchor_views."
            )
        return [head(feats[0])]

    # ------------------------------------------------------------------ loss
    def forward(
        self,
        output: Any,
        target: Any = None,
        *,
        teacher_output: Any = None,
        target_rows: int = 0,
    ) -> dict[str, torch.Tensor]:
        """The loss of the anchors' prototype cosines against the target encoder's.

        Args:
            output: one ``(N, num_prototypes)`` tensor per mapped input (the masked
                anchors, then the focal views).
            target: unused.
            teacher_output: the target encoder's scores on the target views (a tensor or
                a list whose first entry is it).
            target_rows: the first rows of ``output`` that are the target crop (VISSL's
                layout), left out.
        """
        del target
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        outputs = [o[0] if isinstance(o, list | tuple) else o for o in outputs]
        if not outputs or not all(isinstance(o, torch.Tensor) and o.ndim == 2 for o in outputs):
            raise ValueError(
                "msn_loss expects the model's outputs to be (N, num_prototypes) prototype "
                "cosines (msn_head), one per mapped input."
            )
        # VISSL's layout: the model's first rows are its output on the target crop
        anchors = torch.cat([o.float() for o in outputs])[target_rows:]
        given = self.given_teacher_output(teacher_output, "msn_loss")
        teacher = (given if isinstance(given, torch.Tensor) else given[0]).detach()
        batch = teacher.shape[0]
        if batch == 0 or anchors.shape[0] % batch or anchors.shape[1] != teacher.shape[1]:
            raise ValueError(
                f"msn_loss: {tuple(anchors.shape)} anchor scores are not a whole number of "
                f"views of the {tuple(teacher.shape)} target scores."
            )
        num_views = anchors.shape[0] // batch
        targets = msn_targets(
            teacher,
            self.temperature,
            self.target_temperature,
            self.label_smoothing,
            self.use_sinkhorn,
            self.sinkhorn_iterations,
        ).repeat(num_views, 1)
        log_p = msn_anchor_log_probs(anchors, self.temperature, self.label_smoothing)
        ce = -(targets * log_p).sum(dim=1).mean()
        probs = log_p.exp()
        zero = ce.new_zeros(())
        me_max = zero
        if self.me_max_weight > 0:
            count = probs.new_full((1,), float(probs.shape[0]))
            all_reduce_sum(count)
            mean = all_reduce_sum_with_grad(probs.sum(dim=0)) / count
            entropy_of_mean = -(mean * torch.log(mean.clamp(min=1e-30))).sum()
            me_max = (math.log(probs.shape[1]) - entropy_of_mean) * self.me_max_weight
        entropy = zero
        if self.entropy_weight > 0:
            entropy = -(probs * log_p).sum(dim=1).mean() * self.entropy_weight
        return {
            "loss": ce + me_max + entropy,
            "ce": ce.detach(),
            "me_max": me_max.detach(),
            "entropy": entropy.detach(),
        }

    def extra_repr(self) -> str:
        return (
            f"output_dim={self.output_dim}, momentum={self.momentum}, temperature="
            f"{self.temperature}, target_temperature={self.target_temperature}, "
            f"me_max_weight={self.me_max_weight}, entropy_weight={self.entropy_weight}, "
            f"use_sinkhorn={self.use_sinkhorn}, label_smoothing={self.label_smoothing}"
        )
