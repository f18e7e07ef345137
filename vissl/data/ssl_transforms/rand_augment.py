"""``RandAugment``: RandAugment with VISSL's arguments (DeiT's ``rand-m9-mstd0.5-inc1``).

RandAugment (Cubuk et al., https://arxiv.org/abs/1909.13719) applies ``num_layers``
operations drawn at random from a fixed list, all at one global ``magnitude`` on a 0..10
scale. VISSL (and DeiT through timm) use this variant:

- each drawn operation is applied with probability 0.5;
- with ``magnitude_std > 0`` each application draws its magnitude from
  ``N(magnitude, magnitude_std)``, clipped to [0, 10];
- ``increasing_severity`` swaps posterize, solarize, colour, contrast, brightness and
  sharpness for variants whose strength grows with the magnitude (for the enhance
  operations: a factor ``1 +- 0.9 m / 10`` instead of ``0.1 + 1.8 m / 10``);
- rotations, shears and translations take a random sign; geometric operations fill with
  ``img_mean`` and resample with ``interpolation`` (by default bilinear or bicubic, drawn
  each time).

The operations and their magnitude -> argument maps (``m`` in 0..10):

- AutoContrast, Equalize, Invert: no argument;
- Rotate: ``+-30 m / 10`` degrees;
- Posterize: keep ``int(4 m / 10)`` bits (Increasing: ``4 - int(4 m / 10)``);
- Solarize: threshold ``int(256 m / 10)`` (Increasing: ``256 - int(256 m / 10)``);
- SolarizeAdd: add ``int(110 m / 10)`` to the pixels below 128;
- Color, Contrast, Brightness, Sharpness: enhance factor ``0.1 + 1.8 m / 10``
  (Increasing: ``1 +- 0.9 m / 10``);
- ShearX, ShearY: shear ``+-0.3 m / 10``;
- TranslateXRel, TranslateYRel: ``+-translate_pct m / 10`` of the image side.

Works on PIL images (place it before ``ToTensor``). Every random number comes from
torch's CPU generator, which vissl seeds per sample, so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from PIL import Image, ImageEnhance, ImageOps

from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError

#: the top of the magnitude scale
MAX_LEVEL = 10.0
#: probability of applying each drawn operation (VISSL's fixed value)
APPLY_PROB = 0.5
#: the operations of the standard list, in VISSL's order
RAND_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
#: the ``increasing_severity`` list: the same positions, stronger with the magnitude
RAND_INCREASING_OPS = tuple(
    f"{op}Increasing"
    if op in ("Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness")
    else op
    for op in RAND_OPS
)
#: ``weight_choice: 0``: drawing weights by position (the paper's rough gains), as in
#: VISSL; operations are then drawn without replacement.
CHOICE_WEIGHTS_0 = (
    0.025,  # AutoContrast
    0.005,  # Equalize
    0.0,  # Invert
    0.3,  # Rotate
    0.0,  # Posterize
    0.005,  # Solarize
    0.005,  # SolarizeAdd
    0.025,  # Color
    0.005,  # Contrast
    0.005,  # Brightness
    0.025,  # Sharpness
    0.2,  # ShearX
    0.2,  # ShearY
    0.1,  # TranslateXRel
    0.1,  # TranslateYRel
)
_DEFAULT_FILL = (128, 128, 128)
_INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}
_DEFAULT_INTERPOLATION = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)


def _uniform() -> float:
    return float(torch.rand(()).item())


def _signed(value: float) -> float:
    """``value`` or ``-value``, each with probability 1/2."""
    return -value if _uniform() > 0.5 else value


class _Geometry:
    """How the geometric operations fill and resample."""

    def __init__(self, fill: tuple[int, ...], interpolations: tuple[Image.Resampling, ...]) -> None:
        self.fill = fill
        self.interpolations = interpolations

    def fill_for(self, image: Image.Image) -> int | tuple[int, ...]:
        bands = len(image.getbands())
        return self.fill[0] if bands == 1 else tuple(self.fill[:bands])

    def resample(self) -> Image.Resampling:
        if len(self.interpolations) == 1:
            return self.interpolations[0]
        return self.interpolations[int(torch.randint(len(self.interpolations), ()).item())]

    def affine(self, image: Image.Image, matrix: tuple[float, ...]) -> Image.Image:
        return image.transform(
            image.size,
            Image.Transform.AFFINE,
            matrix,
            resample=self.resample(),
            fillcolor=self.fill_for(image),
        )


def _enhance(kind: type[Any], increasing: bool) -> Callable[..., Image.Image]:
    def op(image: Image.Image, level: float, _: _Geometry, __: float) -> Image.Image:
        if increasing:
            factor = 1.0 + _signed(level / MAX_LEVEL * 0.9)
        else:
            factor = level / MAX_LEVEL * 1.8 + 0.1
        return kind(image).enhance(factor)  # type: ignore[no-any-return]

    return op


def _posterize(increasing: bool) -> Callable[..., Image.Image]:
    def op(image: Image.Image, level: float, _: _Geometry, __: float) -> Image.Image:
        bits = int(level / MAX_LEVEL * 4)
        if increasing:
            bits = 4 - bits
        if bits >= 8:
            return image
        # a table, not ImageOps.posterize: 0 bits (magnitude < 2.5) is allowed, a black image
        mask = 0xFF ^ ((1 << (8 - max(bits, 0))) - 1)
        return image.point([i & mask for i in range(256)] * len(image.getbands()))

    return op


def _solarize(increasing: bool) -> Callable[..., Image.Image]:
    def op(image: Image.Image, level: float, _: _Geometry, __: float) -> Image.Image:
        threshold = int(level / MAX_LEVEL * 256)
        if increasing:
            threshold = 256 - threshold
        return ImageOps.solarize(image, threshold)

    return op


def _solarize_add(image: Image.Image, level: float, _: _Geometry, __: float) -> Image.Image:
    add = int(level / MAX_LEVEL * 110)
    if image.mode not in ("L", "RGB"):
        return image
    table = [min(255, i + add) if i < 128 else i for i in range(256)]
    return image.point(table * len(image.getbands()))


def _rotate(image: Image.Image, level: float, geometry: _Geometry, _: float) -> Image.Image:
    degrees = _signed(level / MAX_LEVEL * 30.0)
    return image.rotate(degrees, resample=geometry.resample(), fillcolor=geometry.fill_for(image))


def _shear(axis: str) -> Callable[..., Image.Image]:
    def op(image: Image.Image, level: float, geometry: _Geometry, _: float) -> Image.Image:
        shear = _signed(level / MAX_LEVEL * 0.3)
        matrix = (1, shear, 0, 0, 1, 0) if axis == "x" else (1, 0, 0, shear, 1, 0)
        return geometry.affine(image, matrix)

    return op


def _translate(axis: str) -> Callable[..., Image.Image]:
    def op(image: Image.Image, level: float, geometry: _Geometry, pct: float) -> Image.Image:
        shift = _signed(level / MAX_LEVEL * pct)
        if axis == "x":
            return geometry.affine(image, (1, 0, shift * image.size[0], 0, 1, 0))
        return geometry.affine(image, (1, 0, 0, 0, 1, shift * image.size[1]))

    return op


#: operation name -> ``op(image, level, geometry, translate_pct)``
OPERATIONS: dict[str, Callable[..., Image.Image]] = {
    "AutoContrast": lambda image, *_: ImageOps.autocontrast(image),
    "Equalize": lambda image, *_: ImageOps.equalize(image),
    "Invert": lambda image, *_: ImageOps.invert(image),
    "Rotate": _rotate,
    "Posterize": _posterize(False),
    "PosterizeIncreasing": _posterize(True),
    "Solarize": _solarize(False),
    "SolarizeIncreasing": _solarize(True),
    "SolarizeAdd": _solarize_add,
    **{
        f"{name}{'Increasing' if inc else ''}": _enhance(kind, inc)
        for name, kind in (
            ("Color", ImageEnhance.Color),
            ("Contrast", ImageEnhance.Contrast),
            ("Brightness", ImageEnhance.Brightness),
            ("Sharpness", ImageEnhance.Sharpness),
        )
        for inc in (False, True)
    },
    "ShearX": _shear("x"),
    "ShearY": _shear("y"),
    "TranslateXRel": _translate("x"),
    "TranslateYRel": _translate("y"),
}

# ---------------------------------------------------------------------- arguments
#: every argument, with its default (VISSL's); the last four are timm's hparams
ARGUMENTS: dict[str, Any] = {
    "magnitude": 10,
    "magnitude_std": 0,
    "num_layers": 2,
    "increasing_severity": False,
    "weight_choice": None,
    "translate_pct": 0.45,
    "img_mean": list(_DEFAULT_FILL),
    "interpolation": None,
    "translate_const": 250,
}
_HINTS = {
    "num_ops": "num_layers (VISSL's name for torchvision's num_ops)",
    "n": "num_layers",
    "m": "magnitude",
    "mstd": "magnitude_std",
    "inc": "increasing_severity",
    "num_magnitude_bins": "magnitude on a 0..10 scale (there are no bins)",
}


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _interpolations(value: Any, key: str) -> tuple[Image.Resampling, ...]:
    if value is None:
        return _DEFAULT_INTERPOLATION
    items = list(value) if isinstance(value, list | tuple) else [value]
    out = []
    for item in items:
        if isinstance(item, str) and item.lower() in _INTERPOLATIONS:
            out.append(_INTERPOLATIONS[item.lower()])
        elif isinstance(item, int) and not isinstance(item, bool):
            codes = {int(mode): mode for mode in _INTERPOLATIONS.values()}
            if item not in codes:
                raise ConfigError(
                    f"{key}: {item} is not a PIL code of nearest (0), bilinear (2) or bicubic (3).",
                    key,
                )
            out.append(codes[item])
        else:
            raise ConfigError(
                f"{key} must be one of {sorted(_INTERPOLATIONS)} (or PIL's code 0, 2, 3), or a "
                f"list of them to draw from, got {value!r}.",
                key,
            )
    if not out:
        raise ConfigError(f"{key} must not be an empty list.", key)
    return tuple(out)


def _fill(value: Any, key: str) -> tuple[int, ...]:
    items = [value] * 3 if _real(value) else value
    if (
        not isinstance(items, list | tuple)
        or len(items) != 3
        or not all(_real(v) and 0 <= v <= 255 for v in items)
    ):
        raise ConfigError(
            f"{key} (the fill of rotations, shears and translations) must be a grey level "
            f"0..255 or [r, g, b] of them, got {value!r}.",
            key,
        )
    return tuple(round(v) for v in items)


@register_transform("RandAugment")
class RandAugment:
    """RandAugment on PIL images, with VISSL's arguments (see the module docstring).

    Args:
        magnitude: the magnitude of every operation, in [0, 10] (DeiT: 9).
        magnitude_std: with > 0, each application draws its magnitude from
            ``N(magnitude, magnitude_std)`` clipped to [0, 10] (DeiT: 0.5).
        num_layers: how many operations are drawn per image (with replacement).
        increasing_severity: use the operations whose strength grows with the magnitude
            (DeiT: true).
        weight_choice: null (uniform) or 0 (VISSL's fixed weights, no replacement).
        translate_pct: the largest translation, as a fraction of the image side.
        img_mean: fill of the geometric operations (grey level or [r, g, b]).
        interpolation: ``bilinear`` | ``bicubic`` | ``nearest`` (or PIL's code), or a list
            to draw from each time; default: bilinear or bicubic at random.
        translate_const: timm's absolute translation; accepted for VISSL's configs, unused
            (RandAugment's translations are relative).
        key_path: the config key of this transform, for error messages.
    """

    def __init__(
        self,
        magnitude: float = 10,
        magnitude_std: float = 0,
        num_layers: int = 2,
        increasing_severity: bool = False,
        weight_choice: int | None = None,
        translate_pct: float = 0.45,
        img_mean: int | Sequence[int] = _DEFAULT_FILL,
        interpolation: Any = None,
        translate_const: float = 250,
        key_path: str = "RandAugment",
    ) -> None:
        def key(name: str) -> str:
            return f"{key_path}.{name}"

        if not _real(magnitude) or not 0 <= magnitude <= MAX_LEVEL:
            raise ConfigError(
                f"{key('magnitude')} must be a number in [0, {MAX_LEVEL:g}] (DeiT uses 9), got "
                f"{magnitude!r}.",
                key("magnitude"),
            )
        if not _real(magnitude_std) or magnitude_std < 0:
            raise ConfigError(
                f"{key('magnitude_std')} must be a number >= 0 (0: a fixed magnitude), got "
                f"{magnitude_std!r}.",
                key("magnitude_std"),
            )
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
            raise ConfigError(
                f"{key('num_layers')} (operations per image) must be an integer >= 0, got "
                f"{num_layers!r}.",
                key("num_layers"),
            )
        if not isinstance(increasing_severity, bool):
            raise ConfigError(
                f"{key('increasing_severity')} must be true or false, got {increasing_severity!r}.",
                key("increasing_severity"),
            )
        if weight_choice is not None and (isinstance(weight_choice, bool) or weight_choice != 0):
            raise ConfigError(
                f"{key('weight_choice')} must be null (uniform) or 0 (VISSL's one set of "
                f"weights), got {weight_choice!r}.",
                key("weight_choice"),
            )
        if not _real(translate_pct) or not 0 <= translate_pct <= 1:
            raise ConfigError(
                f"{key('translate_pct')} must be a fraction of the image side in [0, 1], got "
                f"{translate_pct!r}.",
                key("translate_pct"),
            )
        if not _real(translate_const):
            raise ConfigError(
                f"{key('translate_const')} must be a number, got {translate_const!r}.",
                key("translate_const"),
            )
        self.magnitude = float(magnitude)
        self.magnitude_std = float(magnitude_std)
        self.num_layers = int(num_layers)
        self.increasing_severity = increasing_severity
        self.ops = RAND_INCREASING_OPS if increasing_severity else RAND_OPS
        self.weights: torch.Tensor | None = None
        if weight_choice is not None:
            self.weights = torch.tensor(CHOICE_WEIGHTS_0, dtype=torch.float64)
            usable = int((self.weights > 0).sum())
            if self.num_layers > usable:
                raise ConfigError(
                    f"{key('num_layers')}={num_layers}: weight_choice 0 draws without "
                    f"replacement among the {usable} operations of non-zero weight.",
                    key("num_layers"),
                )
        self.translate_pct = float(translate_pct)
        self.geometry = _Geometry(
            _fill(img_mean, key("img_mean")), _interpolations(interpolation, key("interpolation"))
        )
        self.key_path = key_path

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> RandAugment:
        """Build from a ``TRANSFORMS`` entry, naming unknown keys with their key path."""
        for name in kwargs:
            if name not in ARGUMENTS:
                hint = _HINTS.get(name)
                hint_text = f" Did you mean {hint}?" if hint else ""
                raise ConfigError(
                    f"{key_path}.{name} is not an argument of RandAugment.{hint_text} Its "
                    f"arguments: {sorted(ARGUMENTS)}.",
                    f"{key_path}.{name}",
                )
        return cls(**kwargs, key_path=key_path)

    def _draw_ops(self) -> list[str]:
        if self.num_layers == 0:
            return []
        if self.weights is None:
            picks = torch.randint(len(self.ops), (self.num_layers,))
        else:
            picks = torch.multinomial(self.weights, self.num_layers, replacement=False)
        return [self.ops[int(i)] for i in picks]

    def _level(self) -> float:
        level = self.magnitude
        if self.magnitude_std > 0:
            level = level + self.magnitude_std * float(torch.randn(()).item())
        return min(MAX_LEVEL, max(0.0, level))

    def __call__(self, image: Image.Image) -> Image.Image:
        if not isinstance(image, Image.Image):
            raise ConfigError(
                f"{self.key_path} (RandAugment) works on PIL images, got "
                f"{type(image).__name__}: place it before ToTensor.",
                self.key_path,
            )
        for name in self._draw_ops():
            if _uniform() > APPLY_PROB:
                continue
            image = OPERATIONS[name](image, self._level(), self.geometry, self.translate_pct)
        return image

    def __repr__(self) -> str:
        return (
            f"RandAugment(magnitude={self.magnitude:g}, magnitude_std={self.magnitude_std:g}, "
            f"num_layers={self.num_layers}, increasing_severity={self.increasing_severity}, "
            f"weighted={self.weights is not None})"
        )
