"""``RandomErasing``: torchvision's random erasing, with its arguments checked by key.

VISSL's DeiT recipes use torchvision's ``RandomErasing`` by name (``{name: RandomErasing,
p: 0.25}`` between ``ToTensor`` and ``Normalize``). This is that transform (a subclass, so
the draws and the erasing are torchvision's, from torch's generator, which vissl seeds
per sample); it only checks the arguments when the config is read and names the bad key,
and says where it belongs when it is given a PIL image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torchvision.transforms as T

from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError

#: the arguments and torchvision's defaults
ARGUMENTS: dict[str, Any] = {
    "p": 0.5,
    "scale": [0.02, 0.33],
    "ratio": [0.3, 3.3],
    "value": 0,
    "inplace": False,
}


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pair(value: Any, key: str, what: str, low: float, high: float | None) -> tuple[float, float]:
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(_real(v) for v in value)
    )
    if ok:
        first, second = float(value[0]), float(value[1])
        ok = low < first <= second and (high is None or second <= high)
    if not ok:
        bound = f"{low} < min <= max" + (f" <= {high}" if high is not None else "")
        raise ConfigError(f"{key} ({what}) must be [min, max] with {bound}, got {value!r}.", key)
    return first, second


@register_transform("RandomErasing")
class RandomErasing(T.RandomErasing):
    """With probability ``p``, erase a random box of a ``(C, H, W)`` tensor image.

    Args:
        p: probability of erasing (DeiT: 0.25).
        scale: ``[min, max]`` area of the box, as a fraction of the image.
        ratio: ``[min, max]`` aspect ratio of the box.
        value: the fill: a number, one number per channel, or ``"random"`` (normal noise
            per pixel).
        inplace: erase in place.
        key_path: the config key of this transform, for error messages.
    """

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: float | Sequence[float] | str = 0,
        inplace: bool = False,
        key_path: str = "RandomErasing",
    ) -> None:
        def key(name: str) -> str:
            return f"{key_path}.{name}"

        if not _real(p) or not 0.0 <= p <= 1.0:
            raise ConfigError(
                f"{key('p')} (the probability of erasing) must be in [0, 1], got {p!r}.",
                key("p"),
            )
        scale_pair = _pair(scale, key("scale"), "the box area over the image area", 0.0, 1.0)
        ratio_pair = _pair(ratio, key("ratio"), "the box aspect ratio", 0.0, None)
        fill: float | list[float] | str
        if isinstance(value, str):
            if value != "random":
                raise ConfigError(
                    f"{key('value')} must be a number, a list of numbers (one per channel) "
                    f"or 'random', got {value!r}.",
                    key("value"),
                )
            fill = value
        elif isinstance(value, int | float) and _real(value):
            fill = float(value)
        elif isinstance(value, Sequence) and len(value) in (1, 3) and all(_real(v) for v in value):
            fill = [float(v) for v in value]
        else:
            raise ConfigError(
                f"{key('value')} must be a number, a list of 1 or 3 numbers or 'random', got "
                f"{value!r}.",
                key("value"),
            )
        if not isinstance(inplace, bool):
            raise ConfigError(
                f"{key('inplace')} must be true or false, got {inplace!r}.", key("inplace")
            )
        super().__init__(
            p=float(p), scale=scale_pair, ratio=ratio_pair, value=fill, inplace=inplace
        )  # type: ignore[arg-type]
        self.key_path = key_path

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> RandomErasing:
        """Build from a ``TRANSFORMS`` entry, naming unknown keys with their key path."""
        for name in kwargs:
            if name not in ARGUMENTS:
                raise ConfigError(
                    f"{key_path}.{name} is not an argument of RandomErasing; its arguments: "
                    f"{sorted(ARGUMENTS)}.",
                    f"{key_path}.{name}",
                )
        return cls(**kwargs, key_path=key_path)

    def forward(self, img: Any) -> Any:
        if not isinstance(img, torch.Tensor):
            raise ConfigError(
                f"{self.key_path} (RandomErasing) erases tensors, got {type(img).__name__}: "
                "place it after ToTensor.",
                self.key_path,
            )
        if isinstance(self.value, list) and len(self.value) not in (1, img.shape[-3]):
            raise ConfigError(
                f"{self.key_path}.value has {len(self.value)} entries for an image of "
                f"{img.shape[-3]} channels: give 1 or {img.shape[-3]}.",
                f"{self.key_path}.value",
            )
        return super().forward(img)
