"""``ImgPilMultiCropRandomApply``: transforms applied to each crop with a per-crop-type probability."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from vissl.data.ssl_transforms import register_transform
from vissl.data.ssl_transforms.ssl_transforms_wrapper import SSLTransformsWrapper
from vissl.data.ssl_transforms.tensor_path import copy_with, tensor_twin
from vissl.errors import ConfigError, UnknownKeyError
from vissl.utils.registry import closest_match

_DEFAULT_PATH = "config.DATA.<split>.TRANSFORMS[]"
_KEYS = ("transforms", "prob", "nmb_crops", "total_nmb_crops")
_REQUIRED = ("transforms", "prob")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@register_transform("ImgPilMultiCropRandomApply")
class ImgPilMultiCropRandomApply:
    """Apply ``transforms`` to each crop of a multi-crop sample with probability ``prob[type]``.

    As VISSL's ``ImgPilMultiCropRandomApply`` (BYOL/DINO-style asymmetric augmentation,
    e.g. blur always on the first global crop, rarely on the second, solarize only on the
    second). It comes after ``ImgPilToMultiCrop`` and sees the sample's whole list of crops
    (a "grouping" transform): the crops are ordered by type, ``nmb_crops[i]`` crops of type
    ``i`` (as ``ImgPilToMultiCrop``'s ``num_crops``), ``total_nmb_crops`` in all. For each
    crop one number is drawn from torch's generator (seeded per data loader worker); when
    it is below ``prob[type]`` every transform of ``transforms`` is applied to the crop in
    order, else the crop is left as is.

    Config keys (VISSL's names)::

        - name: ImgPilMultiCropRandomApply
          transforms: [{name: ImgPilGaussianBlur, p: 1.0, radius_min: 0.1, radius_max: 2.0}]
          prob: [1.0, 0.1, 0.5]      # one probability per crop type
          total_nmb_crops: 8         # sum(nmb_crops); optional here (VISSL requires it)
          nmb_crops: [1, 1, 6]

    VISSL 0.1.6's form, without ``nmb_crops``, gives one probability per crop
    (``prob: [1.0, 0.1]`` for two crops): each crop is then its own type
    (``nmb_crops: [1, 1]``). Both forms are accepted.

    Args:
        transforms: the transforms, each a ``DATA.<split>.TRANSFORMS``-style entry (built by
            the same builder; it must be a per-image transform and take no ``indices``)
            or a callable.
        prob: probability per crop type, in ``[0, 1]`` (a single number applies to all).
        nmb_crops: number of crops of each type.
        total_nmb_crops: total number of crops, ``sum(nmb_crops)``.
        key_path: the config key of this entry, for error messages.

    Raises:
        ConfigError: a bad key, naming e.g. ``config.DATA.TRAIN.TRANSFORMS[3].prob``.
    """

    ssl_transform_kind: ClassVar[str] = "grouping"

    def __init__(
        self,
        transforms: Sequence[Mapping[str, Any] | Callable[[Any], Any]],
        prob: float | Sequence[float],
        nmb_crops: Sequence[int],
        total_nmb_crops: int | None = None,
        key_path: str = _DEFAULT_PATH,
    ) -> None:
        self.key_path = key_path
        self.nmb_crops = self._check_nmb_crops(nmb_crops)
        self.total_nmb_crops = self._check_total(total_nmb_crops)
        self.prob = self._check_prob(prob)
        self.transforms = self._build_transforms(transforms)
        self.crop_types = [t for t, n in enumerate(self.nmb_crops) for _ in range(n)]

    @classmethod
    def from_transform_config(
        cls, kwargs: Mapping[str, Any], key_path: str = _DEFAULT_PATH
    ) -> ImgPilMultiCropRandomApply:
        """Build from the entry's keys (without ``name``/``indices``), naming bad keys."""
        for key in kwargs:
            if key not in _KEYS:
                close = closest_match(str(key), list(_KEYS))
                hint = f" Did you mean {close!r}?" if close else ""
                raise UnknownKeyError(
                    f"{key_path}.{key} is not a key of ImgPilMultiCropRandomApply.{hint} "
                    f"Its keys: {list(_KEYS)}.",
                    f"{key_path}.{key}",
                )
        for key in _REQUIRED:
            if kwargs.get(key) is None:
                raise ConfigError(
                    f"{key_path}.{key} is required by ImgPilMultiCropRandomApply "
                    f"(keys: transforms, prob, and nmb_crops unless prob has one entry per "
                    f"crop; total_nmb_crops optional).",
                    f"{key_path}.{key}",
                )
        nmb_crops = kwargs.get("nmb_crops")
        if nmb_crops is None:
            prob = kwargs["prob"]
            if not isinstance(prob, Sequence) or isinstance(prob, str):
                raise ConfigError(
                    f"{key_path}.nmb_crops is required with a single prob ({prob!r}): give "
                    "the number of crops of each type (as ImgPilToMultiCrop's num_crops), or "
                    "one probability per crop (VISSL 0.1.6's form, e.g. prob: [1.0, 0.1]).",
                    f"{key_path}.nmb_crops",
                )
            nmb_crops = [1] * len(prob)  # VISSL 0.1.6: one probability per crop
        return cls(
            transforms=kwargs["transforms"],
            prob=kwargs["prob"],
            nmb_crops=nmb_crops,
            total_nmb_crops=kwargs.get("total_nmb_crops"),
            key_path=key_path,
        )

    def _error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.key_path}.{key} {message}", f"{self.key_path}.{key}")

    def _check_nmb_crops(self, nmb_crops: Any) -> list[int]:
        if (
            not isinstance(nmb_crops, Sequence)
            or isinstance(nmb_crops, str)
            or not nmb_crops
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in nmb_crops)
        ):
            raise self._error(
                "nmb_crops",
                f"must list the number of crops of each type (positive integers, as "
                f"ImgPilToMultiCrop's num_crops), got {nmb_crops!r}.",
            )
        return list(nmb_crops)

    def _check_total(self, total: Any) -> int:
        expected = sum(self.nmb_crops)
        if total is None:
            return expected
        if isinstance(total, bool) or not isinstance(total, int) or total != expected:
            raise self._error(
                "total_nmb_crops",
                f"must equal sum(nmb_crops) = {expected} (nmb_crops {self.nmb_crops}), "
                f"got {total!r}.",
            )
        return total

    def _check_prob(self, prob: Any) -> list[float]:
        values = [prob] * len(self.nmb_crops) if _is_number(prob) else prob
        if (
            not isinstance(values, Sequence)
            or isinstance(values, str)
            or len(values) != len(self.nmb_crops)
            or not all(_is_number(p) and 0.0 <= p <= 1.0 for p in values)
        ):
            raise self._error(
                "prob",
                f"must give one probability in [0, 1] per crop type "
                f"({len(self.nmb_crops)} types: nmb_crops {self.nmb_crops}), got {prob!r}.",
            )
        return [float(p) for p in values]

    def _build_transforms(self, transforms: Any) -> list[Callable[[Any], Any]]:
        if not isinstance(transforms, Sequence) or isinstance(transforms, str) or not transforms:
            raise self._error(
                "transforms",
                "must be a non-empty list of transform entries like "
                f"[{{name: ImgPilGaussianBlur, p: 1.0}}], got {transforms!r}.",
            )
        built: list[Callable[[Any], Any]] = []
        for j, entry in enumerate(transforms):
            path = f"{self.key_path}.transforms[{j}]"
            if not isinstance(entry, Mapping):
                if callable(entry):
                    built.append(entry)
                    continue
                raise ConfigError(
                    f"{path} must be a transform entry like {{name: ImgPilRandomSolarize, "
                    f"p: 1.0}}, got {entry!r}.",
                    path,
                )
            wrapper = SSLTransformsWrapper.from_config(entry, key_path=path)
            if wrapper.kind != "image" or wrapper.indices:
                raise ConfigError(
                    f"{path} ({wrapper.name}) must be a transform of one image without "
                    f"indices: ImgPilMultiCropRandomApply applies it to each crop on its own "
                    f"(it is a {wrapper.kind!r} transform"
                    + (f" with indices {list(wrapper.indices)})." if wrapper.indices else ")."),
                    path,
                )
            built.append(wrapper.transform)
        return built

    def __call__(self, crops: Sequence[Any]) -> list[Any]:
        if len(crops) != self.total_nmb_crops:
            raise self._error(
                "total_nmb_crops",
                f"is {self.total_nmb_crops} but the sample has {len(crops)} data entries "
                "here: put ImgPilMultiCropRandomApply after ImgPilToMultiCrop with the same "
                "crop counts.",
            )
        out = []
        for crop, crop_type in zip(crops, self.crop_types):
            if torch.rand(()).item() < self.prob[crop_type]:
                for transform in self.transforms:
                    crop = transform(crop)
            out.append(crop)
        return out

    def tensor_transform(self) -> ImgPilMultiCropRandomApply | None:
        """A copy whose transforms are their tensor twins, or None if one has none."""
        twins = [tensor_twin(t) for t in self.transforms]
        if any(t is None for t in twins):
            return None
        return copy_with(self, transforms=twins)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return (
            f"ImgPilMultiCropRandomApply(transforms={self.transforms!r}, prob={self.prob}, "
            f"nmb_crops={self.nmb_crops}, total_nmb_crops={self.total_nmb_crops})"
        )
