"""``cutmixup_collator``: mixup and CutMix with label smoothing, DeiT's batch recipe.

Mixup (Zhang et al., https://arxiv.org/abs/1710.09412) blends two images,
``x = lam * x_i + (1 - lam) * x_j``; CutMix (Yun et al., https://arxiv.org/abs/1905.04899)
pastes a box of ``x_j`` into ``x_i``, ``lam`` being the share of ``x_i`` that is left. The
targets become soft, ``t = lam * y_i + (1 - lam) * y_j``, where ``y`` is the label-smoothed
one-hot vector (``1 - s + s / K`` on the class, ``s / K`` elsewhere). As in VISSL (which
took timm's implementation), the partner of row ``i`` is row ``B - 1 - i`` (the batch
flipped), ``lam`` is drawn from ``Beta(alpha, alpha)``, and ``mode`` says how often it
is drawn:

- ``batch``: one draw (mixup or CutMix, one ``lam``, one box) for the whole batch;
- ``pair``: one draw per pair ``(i, B - 1 - i)``, applied to both (even batches only);
- ``elem``: one draw per row.

Each view of a multi-view sample is mixed on its own, views in order. The random numbers
come from a ``numpy.random.RandomState`` seeded from the batch (see :func:`batch_rng`), in
the order VISSL draws them from numpy's global generator; nothing global is touched, so
the mixing is the same with any number of workers and after a resume. The loss for the
soft targets is ``cross_entropy_multiple_output_single_target``, which takes ``(B, K)``
targets (``-sum_k t_k log softmax(z)_k``), and ``accuracy_list_meter`` scores them by
their arg-max.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data, view_major
from vissl.data.collators.moco_collator import moco_collator
from vissl.data.collators.simclr_collator import simclr_collator
from vissl.errors import ConfigError

NAME = "cutmixup_collator"
_KEY = "config.DATA.<split>.COLLATE_FUNCTION_PARAMS"
MODES = ("batch", "pair", "elem")
#: VISSL's ``ssl_method``: lay the mixed views out for these collators instead.
SSL_METHODS = ("simclr", "moco")
#: the first entropy word of the seed of a batch that carries none of its own
_FALLBACK_STREAM = 0x6D6978


@dataclass(frozen=True)
class MixSettings:
    """The checked ``COLLATE_FUNCTION_PARAMS`` of ``cutmixup_collator``."""

    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: tuple[float, float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.1
    num_classes: int = 1000
    ssl_method: str | None = None

    @property
    def use_mixup(self) -> bool:
        return self.mixup_alpha > 0.0

    @property
    def use_cutmix(self) -> bool:
        return self.cutmix_alpha > 0.0


def _number(params: Mapping[str, Any], name: str, default: float, key_path: str) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        full = f"{key_path}.{name}"
        raise ConfigError(f"{full} must be a number, got {value!r}.", full)
    return float(value)


def _in_unit_interval(value: float, name: str, key_path: str, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        full = f"{key_path}.{name}"
        raise ConfigError(f"{full} ({what}) must be in [0, 1], got {value}.", full)
    return value


def mix_settings(params: Mapping[str, Any], key_path: str = _KEY) -> MixSettings:
    """Check ``COLLATE_FUNCTION_PARAMS`` (VISSL's keys and defaults) into :class:`MixSettings`.

    Raises:
        ConfigError: a value out of range or of the wrong type, naming ``key_path.<key>``.
    """
    allowed = set(MixSettings.__dataclass_fields__)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError(
            f"{key_path}: {NAME} does not take {unknown}; its keys are {sorted(allowed)}.",
            f"{key_path}.{unknown[0]}",
        )
    defaults = MixSettings()

    def number(name: str) -> float:
        return _number(params, name, getattr(defaults, name), key_path)

    mixup_alpha, cutmix_alpha = number("mixup_alpha"), number("cutmix_alpha")
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if value < 0:
            raise ConfigError(
                f"{key_path}.{name} must be >= 0 (0 turns it off), got {value}.",
                f"{key_path}.{name}",
            )
    minmax_value = params.get("cutmix_minmax")
    minmax: tuple[float, float] | None = None
    if minmax_value is not None:
        ok = (
            isinstance(minmax_value, Sequence)
            and not isinstance(minmax_value, str)
            and len(minmax_value) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in minmax_value)
        )
        if not ok or not 0.0 < float(minmax_value[0]) < float(minmax_value[1]) <= 1.0:
            raise ConfigError(
                f"{key_path}.cutmix_minmax must be null or [min, max] with "
                f"0 < min < max <= 1 (the box side as a fraction of the image side, e.g. "
                f"[0.2, 0.8]), got {minmax_value!r}.",
                f"{key_path}.cutmix_minmax",
            )
        minmax = (float(minmax_value[0]), float(minmax_value[1]))
        # As in VISSL: the box comes from min/max, so CutMix is on (alpha 1 is its switch).
        cutmix_alpha = 1.0
    if mixup_alpha == 0.0 and cutmix_alpha == 0.0:
        raise ConfigError(
            f"{key_path}.mixup_alpha and cutmix_alpha are both 0, so neither mixup nor "
            "CutMix is on; set mixup_alpha > 0, cutmix_alpha > 0 or cutmix_minmax (DeiT: "
            "mixup_alpha 0.8, cutmix_alpha 1.0).",
            f"{key_path}.mixup_alpha",
        )
    prob = _in_unit_interval(
        number("prob"), "prob", key_path, "the probability of mixing a batch, pair or row"
    )
    switch_prob = _in_unit_interval(
        number("switch_prob"), "switch_prob", key_path, "the probability of CutMix over mixup"
    )
    smoothing = _in_unit_interval(
        number("label_smoothing"), "label_smoothing", key_path, "the label smoothing"
    )
    mode = params.get("mode", defaults.mode)
    if mode not in MODES:
        raise ConfigError(
            f"{key_path}.mode must be one of {list(MODES)}, got {mode!r}.", f"{key_path}.mode"
        )
    correct_lam = params.get("correct_lam", defaults.correct_lam)
    if not isinstance(correct_lam, bool):
        raise ConfigError(
            f"{key_path}.correct_lam must be true or false, got {correct_lam!r}.",
            f"{key_path}.correct_lam",
        )
    num_classes = params.get("num_classes", defaults.num_classes)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(
            f"{key_path}.num_classes must be a positive integer (the number of classes of "
            f"the labels), got {num_classes!r}.",
            f"{key_path}.num_classes",
        )
    ssl_method = params.get("ssl_method")
    if ssl_method is not None and ssl_method not in SSL_METHODS:
        raise ConfigError(
            f"{key_path}.ssl_method must be null or one of {list(SSL_METHODS)}, got "
            f"{ssl_method!r}.",
            f"{key_path}.ssl_method",
        )
    return MixSettings(
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        cutmix_minmax=minmax,
        prob=prob,
        switch_prob=switch_prob,
        mode=str(mode),
        correct_lam=correct_lam,
        label_smoothing=smoothing,
        num_classes=int(num_classes),
        ssl_method=ssl_method,
    )


def check_params(params: Mapping[str, Any], key_path: str = _KEY) -> None:
    """Check ``COLLATE_FUNCTION_PARAMS`` when the data loader is built."""
    mix_settings(params, key_path)


def batch_rng(batch: Sequence[Mapping[str, Any]]) -> np.random.RandomState:
    """The generator of a batch's mixing.

    Seeded by the batch's ``seed`` (set by ``GenericSSLDataset`` from the run's seed, the
    epoch and the batch's indices); a batch without one (a list built by hand) is seeded
    from its samples' ``data_idx``.
    """
    seed = getattr(batch, "seed", None)
    if seed is None:
        indices = [int(i) for sample in batch for i in sample["data_idx"]]
        seed = int(np.random.SeedSequence([_FALLBACK_STREAM, *indices]).generate_state(1)[0])
    return np.random.RandomState(int(seed))


# ---------------------------------------------------------------------- the draws
def draw_batch(settings: MixSettings, rng: np.random.RandomState) -> tuple[float, bool]:
    """``(lam, use_cutmix)`` for a whole batch; ``lam`` 1 leaves it unmixed."""
    if not rng.rand() < settings.prob:
        return 1.0, False
    if settings.use_mixup and settings.use_cutmix:
        use_cutmix = bool(rng.rand() < settings.switch_prob)
        alpha = settings.cutmix_alpha if use_cutmix else settings.mixup_alpha
        return float(rng.beta(alpha, alpha)), use_cutmix
    if settings.use_mixup:
        return float(rng.beta(settings.mixup_alpha, settings.mixup_alpha)), False
    return float(rng.beta(settings.cutmix_alpha, settings.cutmix_alpha)), True


def draw_rows(
    settings: MixSettings, rng: np.random.RandomState, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(lam, use_cutmix)`` arrays for ``n`` rows (``elem``) or pairs (``pair``)."""
    use_cutmix = np.zeros(n, dtype=bool)
    if settings.use_mixup and settings.use_cutmix:
        use_cutmix = rng.rand(n) < settings.switch_prob
        lam_cutmix = rng.beta(settings.cutmix_alpha, settings.cutmix_alpha, size=n)
        lam_mixup = rng.beta(settings.mixup_alpha, settings.mixup_alpha, size=n)
        lam = np.where(use_cutmix, lam_cutmix, lam_mixup)
    elif settings.use_mixup:
        lam = rng.beta(settings.mixup_alpha, settings.mixup_alpha, size=n)
    else:
        use_cutmix = np.ones(n, dtype=bool)
        lam = rng.beta(settings.cutmix_alpha, settings.cutmix_alpha, size=n)
    mixed = rng.rand(n) < settings.prob
    return np.where(mixed, lam.astype(np.float32), np.float32(1.0)), use_cutmix


def cut_box(
    settings: MixSettings, rng: np.random.RandomState, height: int, width: int, lam: float
) -> tuple[tuple[int, int, int, int], float]:
    """The CutMix box ``(top, bottom, left, right)`` and the ``lam`` to use with it.

    Without ``cutmix_minmax`` the box has sides ``sqrt(1 - lam)`` of the image's around a
    uniformly drawn centre, clipped at the borders; with it, each side is drawn in
    ``[min, max)`` of the image's and the box lies inside the image. ``lam`` becomes the
    uncovered share of the image with ``correct_lam`` or ``cutmix_minmax``.

    Raises:
        ConfigError: ``cutmix_minmax`` gives no whole pixel range on this image size.
    """
    if settings.cutmix_minmax is not None:
        low, high = settings.cutmix_minmax
        ranges = [(int(side * low), int(side * high)) for side in (height, width)]
        if any(lo >= hi for lo, hi in ranges):
            raise ConfigError(
                f"{_KEY}.cutmix_minmax {list(settings.cutmix_minmax)} leaves no box size to "
                f"draw on {height} x {width} images (pixel ranges {ranges}); widen it.",
                f"{_KEY}.cutmix_minmax",
            )
        cut_h = int(rng.randint(*ranges[0]))
        cut_w = int(rng.randint(*ranges[1]))
        top = int(rng.randint(0, height - cut_h))
        left = int(rng.randint(0, width - cut_w))
        box = (top, top + cut_h, left, left + cut_w)
    else:
        side = math.sqrt(1.0 - lam)
        half_h, half_w = int(height * side) // 2, int(width * side) // 2
        center_y = int(rng.randint(0, height))
        center_x = int(rng.randint(0, width))
        box = (
            min(max(center_y - half_h, 0), height),
            min(max(center_y + half_h, 0), height),
            min(max(center_x - half_w, 0), width),
            min(max(center_x + half_w, 0), width),
        )
    if settings.correct_lam or settings.cutmix_minmax is not None:
        area = (box[1] - box[0]) * (box[3] - box[2])
        lam = 1.0 - area / float(height * width)
    return box, lam


# ---------------------------------------------------------------------- mixing
def mix_images(
    images: torch.Tensor, settings: MixSettings, rng: np.random.RandomState
) -> torch.Tensor:
    """Mix ``images`` ``(B, C, H, W)`` in place with their flipped batch; return each
    row's ``lam`` ``(B,)`` (float32), the weight of its own label."""
    size = images.shape[0]
    height, width = int(images.shape[-2]), int(images.shape[-1])
    if settings.mode == "batch":
        lam, use_cutmix = draw_batch(settings, rng)
        if lam == 1.0:
            return torch.ones(size, dtype=torch.float32)
        partner = images.flip(0)  # a copy
        if use_cutmix:
            (top, bottom, left, right), lam = cut_box(settings, rng, height, width, lam)
            images[..., top:bottom, left:right] = partner[..., top:bottom, left:right]
        else:
            images.mul_(lam).add_(partner.mul_(1.0 - lam))
        return torch.full((size,), lam, dtype=torch.float32)
    pairs = settings.mode == "pair"
    if pairs and size % 2:
        raise ConfigError(
            f"{_KEY}.mode 'pair' mixes rows i and B-1-i and needs an even batch, got {size} "
            "rows: use an even config.DATA.<split>.BATCHSIZE_PER_REPLICA with DROP_LAST: "
            "True, or mode 'batch' / 'elem'.",
            f"{_KEY}.mode",
        )
    num_draws = size // 2 if pairs else size
    lams, cutmix_rows = draw_rows(settings, rng, num_draws)
    source = images.clone()
    row_lam = np.ones(size, dtype=np.float64)
    for i in range(num_draws):
        j = size - 1 - i
        lam = float(lams[i])
        if lam != 1.0:
            if cutmix_rows[i]:
                (top, bottom, left, right), lam = cut_box(settings, rng, height, width, lam)
                images[i, :, top:bottom, left:right] = source[j, :, top:bottom, left:right]
                if pairs:
                    images[j, :, top:bottom, left:right] = source[i, :, top:bottom, left:right]
            else:
                images[i] = source[i] * lam + source[j] * (1.0 - lam)
                if pairs:
                    images[j] = source[j] * lam + source[i] * (1.0 - lam)
        row_lam[i] = lam
        if pairs:
            row_lam[j] = lam
    return torch.from_numpy(row_lam).to(torch.float32)


def soft_targets(
    labels: torch.Tensor, lam: torch.Tensor, num_classes: int, smoothing: float
) -> torch.Tensor:
    """``lam * y + (1 - lam) * y.flip(0)`` with ``y`` the smoothed one-hot labels."""
    off = smoothing / num_classes
    one_hot = torch.full((labels.shape[0], num_classes), off, dtype=torch.float32)
    one_hot.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)
    weight = lam.to(torch.float32).view(-1, 1)
    return one_hot * weight + one_hot.flip(0) * (1.0 - weight)


def _class_labels(batch: Sequence[Mapping[str, Any]], view: int, num_classes: int) -> torch.Tensor:
    labels = []
    for sample in batch:
        label = as_tensor(sample["label"][view])
        if label.numel() != 1 or label.is_floating_point() or label.is_complex():
            raise ConfigError(
                f"{NAME}: each view needs one integer class label, got {label.tolist()!r}; "
                "use config.DATA.<split>.LABEL_TYPE: standard with a labelled data source.",
                "config.DATA.<split>.LABEL_TYPE",
            )
        value = int(label.item())
        if not 0 <= value < num_classes:
            raise ConfigError(
                f"{NAME}: label {value} is not in [0, num_classes={num_classes}); set "
                f"{_KEY}.num_classes to the data set's number of classes (a label -1 means "
                "the sample has none: use a labelled data source).",
                f"{_KEY}.num_classes",
            )
        labels.append(value)
    return torch.tensor(labels, dtype=torch.long)


@register_collator(NAME)
def cutmixup_collator(
    batch: Sequence[dict[str, Any]],
    mixup_alpha: float = 1.0,
    cutmix_alpha: float = 0.0,
    cutmix_minmax: Sequence[float] | None = None,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    mode: str = "batch",
    correct_lam: bool = True,
    label_smoothing: float = 0.1,
    num_classes: int = 1000,
    ssl_method: str | None = None,
) -> dict[str, Any]:
    """Collate ``B`` samples of ``V`` views, each view mixed across the batch (VISSL's keys).

    Output (as VISSL's, the views in a list like ``multicrop_collator``; ``K`` classes)::

        {"data": [[Tensor(B, C, H, W) per view]],
         "label": [Tensor(V * B, K)],            # soft targets, view-major
         "data_valid": [Tensor(V * B)], "data_idx": [Tensor(V * B)]}

    With ``ssl_method`` ``simclr`` or ``moco`` the mixed views and soft targets are laid
    out by that collator instead.

    Args:
        batch: the samples (images already tensors: end the transforms with ToTensor).
        mixup_alpha: mixup's ``Beta(alpha, alpha)``; 0 turns mixup off.
        cutmix_alpha: CutMix's ``Beta(alpha, alpha)``; 0 turns CutMix off.
        cutmix_minmax: ``[min, max]`` box side fractions; sets CutMix on, the box no longer
            follows ``lam``.
        prob: probability of mixing the batch (``batch``), a pair or a row.
        switch_prob: probability of CutMix rather than mixup when both are on.
        mode: ``batch`` | ``pair`` | ``elem``.
        correct_lam: ``lam`` becomes the uncovered share when the box is clipped.
        label_smoothing: label smoothing of the one-hot targets, in ``[0, 1]``.
        num_classes: number of classes of the labels.
        ssl_method: ``null``, ``simclr`` or ``moco`` (see above).

    Raises:
        ConfigError: an invalid parameter, images that are not float tensors, labels that
            are not classes in ``[0, num_classes)``, an odd batch in ``pair`` mode.
    """
    settings = mix_settings(
        {
            "mixup_alpha": mixup_alpha,
            "cutmix_alpha": cutmix_alpha,
            "cutmix_minmax": cutmix_minmax,
            "prob": prob,
            "switch_prob": switch_prob,
            "mode": mode,
            "correct_lam": correct_lam,
            "label_smoothing": label_smoothing,
            "num_classes": num_classes,
            "ssl_method": ssl_method,
        }
    )
    num_views = check_batch(batch, NAME)
    check_tensor_data(batch, NAME)
    rng = batch_rng(batch)
    views: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    for view in range(num_views):
        images = torch.stack([as_tensor(sample["data"][view]) for sample in batch])
        if not images.is_floating_point() or images.ndim != 4:
            raise ConfigError(
                f"{NAME}: view {view} must be float images (C, H, W) to be mixed, got "
                f"{images.dtype} of shape {tuple(images.shape[1:])}; end "
                "config.DATA.<split>.TRANSFORMS with ToTensor (and Normalize).",
                "config.DATA.<split>.TRANSFORMS",
            )
        labels = _class_labels(batch, view, settings.num_classes)
        lam = mix_images(images, settings, rng)
        views.append(images)
        targets.append(soft_targets(labels, lam, settings.num_classes, settings.label_smoothing))
    if settings.ssl_method is not None:
        mixed = [
            {
                "data": [views[v][i] for v in range(num_views)],
                "label": [targets[v][i] for v in range(num_views)],
                "data_valid": list(sample["data_valid"]),
                "data_idx": list(sample["data_idx"]),
            }
            for i, sample in enumerate(batch)
        ]
        if settings.ssl_method == "moco":
            return moco_collator(mixed)
        return simclr_collator(mixed)
    return {
        "data": [views],
        "label": [torch.cat(targets)],
        "data_valid": [view_major(batch, "data_valid", num_views)],
        "data_idx": [view_major(batch, "data_idx", num_views)],
    }


cutmixup_collator.check_params = check_params  # type: ignore[attr-defined]
