"""The tensor path: the transforms before ``ToTensor`` run on tensors instead of PIL images.

VISSL's chains (SimCLR, SwAV, DINO, MoCo, and the evaluation ones) are a run of PIL
transforms that ends in ``ToTensor`` (usually followed by ``Normalize``). Nothing between
the first of them and ``ToTensor`` can see how the image is stored, so
:func:`plan_tensor_path` runs that run on tensors: the image is converted once to a
``uint8`` tensor, each transform is replaced by its *tensor twin*, which draws the same
random numbers from the same generators and applies the same operation (see
:mod:`vissl.data.ssl_transforms.tensor_ops`), and ``ToTensor`` + ``Normalize`` become one
pass. Outputs match the PIL chain up to 8-bit rounding; the random parameters (crop boxes,
flips, jitter factors and order, blur radii) are the very same for the same seed.

Which transform has a twin:

- vissl's transforms with a ``tensor_transform()`` method (``ImgReplicatePil``,
  ``ImgPilToMultiCrop``, ``ImgPilColorDistortion``, ``ImgPilGaussianBlur``,
  ``ImgPilRandomSolarize``, ``ImgPilMultiCropRandomApply``); a plugin transform can join
  the tensor path the same way: ``tensor_transform()`` returns a callable that takes and
  returns ``(C, H, W)`` tensors (uint8 0..255 or float32 0..1) without modifying its
  input, or None;
- torchvision's ``RandomResizedCrop`` and ``Resize`` (bilinear), ``ColorJitter``,
  ``RandomGrayscale``, ``RandomApply``, ``Compose``, ``RandomHorizontalFlip``,
  ``RandomVerticalFlip``, ``CenterCrop``, ``RandomCrop`` and ``ToTensor``.

The run stops (going back from ``ToTensor``) at the first transform without a twin, or
with ``indices``; the transforms before it stay on PIL images.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

from vissl.data.ssl_transforms import tensor_ops
from vissl.data.ssl_transforms.sample_wrapper import TENSOR_PATH_START, SSLTransformsWrapper

logger = logging.getLogger(__name__)

TensorTransform = Callable[[Any], Any]
_TWIN_FACTORIES: dict[type, Callable[[Any], TensorTransform | None]] = {}


def register_tensor_twin(
    cls: type,
) -> Callable[[Callable[[Any], TensorTransform | None]], Callable[[Any], TensorTransform | None]]:
    """Register a factory ``f(transform) -> twin | None`` for transforms of exactly ``cls``."""

    def decorator(
        factory: Callable[[Any], TensorTransform | None],
    ) -> Callable[[Any], TensorTransform | None]:
        _TWIN_FACTORIES[cls] = factory
        return factory

    return decorator


def tensor_twin(transform: Any) -> TensorTransform | None:
    """The tensor form of ``transform``, or None when it has none.

    A transform's own ``tensor_transform()`` method wins; otherwise the factory registered
    for its exact class (subclasses may behave differently, so they are not matched).
    """
    method = getattr(transform, "tensor_transform", None)
    if callable(method):
        return method()  # type: ignore[no-any-return]
    factory = _TWIN_FACTORIES.get(type(transform))
    return factory(transform) if factory is not None else None


def _bilinear(interpolation: Any) -> bool:
    return interpolation in (T.InterpolationMode.BILINEAR, Image.Resampling.BILINEAR)


def _float_copy(image: torch.Tensor) -> torch.Tensor:
    """A float32 copy in [0, 1] that the caller may modify."""
    return tensor_ops.to_float(image)


class ToImageTensor:
    """The start of the tensor path: a PIL image (or uint8 array) as a uint8 tensor.

    RGB and L images keep their bands (other modes become RGB, as the data sources
    return them); tensors pass through.
    """

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, torch.Tensor):
            return image
        if isinstance(image, Image.Image):
            return tensor_ops.pil_to_uint8(image)
        if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim in (2, 3):
            array = image[:, :, None] if image.ndim == 2 else image
            return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
        raise TypeError(
            "the tensor path of the transforms takes PIL images or uint8 HWC arrays, got "
            f"{type(image).__name__}; turn it off with DATA.<split>.FAST_TRANSFORMS: False"
        )

    def __repr__(self) -> str:
        return "ToImageTensor()"


class TensorCompose:
    """``Compose`` of tensor twins."""

    def __init__(self, transforms: Sequence[TensorTransform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            image = transform(image)
        return image

    def __repr__(self) -> str:
        return f"TensorCompose({self.transforms!r})"


class TensorRandomApply:
    """``RandomApply``: the same draw (``p < torch.rand(1)`` skips), tensor twins inside."""

    def __init__(self, transforms: Sequence[TensorTransform], p: float) -> None:
        self.transforms = list(transforms)
        self.p = float(p)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if self.p < torch.rand(1):
            return image
        for transform in self.transforms:
            image = transform(image)
        return image

    def __repr__(self) -> str:
        return f"TensorRandomApply(p={self.p}, {self.transforms!r})"


class TensorRandomResizedCrop:
    """``RandomResizedCrop`` (bilinear, antialiased as Pillow): the same boxes as on PIL.

    The box comes from torchvision's own ``RandomResizedCrop.get_params`` on the image
    size, so the same generator state gives the same box on either path.
    """

    def __init__(self, size: Sequence[int], scale: Sequence[float], ratio: Sequence[float]) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.scale = [float(s) for s in scale]
        self.ratio = [float(r) for r in ratio]

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, height, width = T.RandomResizedCrop.get_params(image, self.scale, self.ratio)
        return tensor_ops.resized_crop(image, top, left, height, width, self.size)

    def __repr__(self) -> str:
        return f"TensorRandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class TensorResize:
    """``Resize`` (bilinear, antialiased as Pillow)."""

    def __init__(self, size: Any, max_size: int | None) -> None:
        self.size = size
        self.max_size = max_size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if image.dtype == torch.uint8 and image.shape[0] in (3, 4):
            # torch's fast uint8 kernel wants channels-last memory
            image = image.unsqueeze(0).contiguous(memory_format=torch.channels_last)[0]
        elif image.dtype == torch.uint8:
            image = tensor_ops.to_float(image)
        return TF.resize(
            image,
            self.size,
            interpolation=T.InterpolationMode.BILINEAR,
            max_size=self.max_size,
            antialias=True,
        )

    def __repr__(self) -> str:
        return f"TensorResize(size={self.size}, max_size={self.max_size})"


class TensorColorJitter:
    """``ColorJitter``: the same draws (``ColorJitter.get_params``), the PIL operations.

    Args:
        brightness, contrast, saturation, hue: the ranges as ``ColorJitter`` stores them
            (``(min, max)`` or None).
    """

    def __init__(self, brightness: Any, contrast: Any, saturation: Any, hue: Any) -> None:
        self.brightness = brightness
        self.contrast = contrast
        self.saturation = saturation
        self.hue = hue

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        order, brightness, contrast, saturation, hue = T.ColorJitter.get_params(
            self.brightness, self.contrast, self.saturation, self.hue
        )
        out = _float_copy(image)
        for op in order.tolist():
            if op == 0 and brightness is not None:
                tensor_ops.adjust_brightness_(out, brightness)
            elif op == 1 and contrast is not None:
                tensor_ops.adjust_contrast_(out, contrast)
            elif op == 2 and saturation is not None:
                tensor_ops.adjust_saturation_(out, saturation)
            elif op == 3 and hue is not None:
                tensor_ops.adjust_hue_(out, hue)
        return out

    def __repr__(self) -> str:
        return (
            f"TensorColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue})"
        )


class TensorRandomGrayscale:
    """``RandomGrayscale``: the same draw, Pillow's grey levels, the channels kept."""

    def __init__(self, p: float) -> None:
        self.p = float(p)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if torch.rand(1) < self.p:
            channels = image.shape[0]
            if image.dtype == torch.uint8:
                image = tensor_ops.to_float(image)
            return tensor_ops.to_grayscale(image, channels)
        return image

    def __repr__(self) -> str:
        return f"TensorRandomGrayscale(p={self.p})"


class TensorToTensor:
    """``ToTensor`` (and the ``Normalize`` right after it, when given): one pass.

    The result is a new contiguous float32 ``(C, H, W)`` tensor, as ``ToTensor`` gives;
    with ``mean``/``std`` it is ``(x - mean) / std``, computed as ``x * a + b``.
    """

    def __init__(
        self, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
    ) -> None:
        self.mean = None if mean is None else [float(m) for m in mean]
        self.std = None if std is None else [float(s) for s in std]
        self._scale: torch.Tensor | None = None
        self._scale_uint8: torch.Tensor | None = None
        self._shift: torch.Tensor | None = None
        if self.mean is not None and self.std is not None:
            std_t = torch.tensor(self.std, dtype=torch.float64).view(-1, 1, 1)
            mean_t = torch.tensor(self.mean, dtype=torch.float64).view(-1, 1, 1)
            self._scale = (1.0 / std_t).float()
            self._scale_uint8 = (1.0 / (255.0 * std_t)).float()
            self._shift = (-mean_t / std_t).float()

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if self._scale is None or self._scale_uint8 is None or self._shift is None:
            return tensor_ops.to_float(image)  # a new tensor, also from float input
        if image.dtype == torch.uint8:
            out = torch.empty(image.shape, dtype=torch.float32)
            out.copy_(image)
            return out.mul_(self._scale_uint8).add_(self._shift)
        return torch.addcmul(self._shift, image, self._scale).contiguous()

    def __repr__(self) -> str:
        if self.mean is None:
            return "TensorToTensor()"
        return f"TensorToTensor(normalize: mean={self.mean}, std={self.std})"


class TensorReplicate:
    """``ImgReplicatePil`` on tensors: the same tensor ``num_times`` (twins never modify
    their input, so the copies need not be made)."""

    def __init__(self, num_times: int) -> None:
        self.num_times = int(num_times)

    def __call__(self, image: torch.Tensor) -> list[torch.Tensor]:
        return [image] * self.num_times

    def __repr__(self) -> str:
        return f"TensorReplicate(num_times={self.num_times})"


class TensorToMultiCrop:
    """``ImgPilToMultiCrop`` on tensors: one crop twin per crop, from one decoded image."""

    def __init__(self, crops: Sequence[TensorRandomResizedCrop], description: str) -> None:
        self.crops = list(crops)
        self.description = description

    def __call__(self, image: torch.Tensor) -> list[torch.Tensor]:
        return [crop(image) for crop in self.crops]

    def __repr__(self) -> str:
        return f"TensorToMultiCrop({self.description})"


@register_tensor_twin(T.RandomResizedCrop)
def _random_resized_crop(transform: T.RandomResizedCrop) -> TensorTransform | None:
    if not _bilinear(transform.interpolation):
        return None
    return TensorRandomResizedCrop(transform.size, transform.scale, transform.ratio)


@register_tensor_twin(T.Resize)
def _resize(transform: T.Resize) -> TensorTransform | None:
    if not _bilinear(transform.interpolation):
        return None
    return TensorResize(transform.size, transform.max_size)


@register_tensor_twin(T.ColorJitter)
def _color_jitter(transform: T.ColorJitter) -> TensorTransform:
    return TensorColorJitter(
        transform.brightness, transform.contrast, transform.saturation, transform.hue
    )


@register_tensor_twin(T.RandomGrayscale)
def _random_grayscale(transform: T.RandomGrayscale) -> TensorTransform:
    return TensorRandomGrayscale(transform.p)


@register_tensor_twin(T.RandomApply)
def _random_apply(transform: T.RandomApply) -> TensorTransform | None:
    twins = [tensor_twin(t) for t in transform.transforms]
    if any(t is None for t in twins):
        return None
    return TensorRandomApply(twins, transform.p)  # type: ignore[arg-type]


@register_tensor_twin(T.Compose)
def _compose(transform: T.Compose) -> TensorTransform | None:
    twins = [tensor_twin(t) for t in transform.transforms]
    if any(t is None for t in twins):
        return None
    return TensorCompose(twins)  # type: ignore[arg-type]


@register_tensor_twin(T.ToTensor)
def _to_tensor(transform: T.ToTensor) -> TensorTransform:
    return TensorToTensor()


def _itself(transform: Any) -> TensorTransform:
    """torchvision transforms that already work on tensors, without modifying them."""
    return transform  # type: ignore[no-any-return]


for _cls in (T.RandomHorizontalFlip, T.RandomVerticalFlip, T.CenterCrop, T.RandomCrop):
    register_tensor_twin(_cls)(_itself)


def _fusable_normalize(wrapper: Any) -> bool:
    """A torchvision ``Normalize`` of every entry (a zero std is left to raise its error)."""
    transform = wrapper.transform
    if type(transform) is not T.Normalize or wrapper.indices:
        return False
    return all(float(s) != 0.0 for s in transform.std)


def plan_tensor_path(wrappers: Sequence[Any]) -> list[Any]:
    """Run the transforms before the first ``ToTensor`` on tensors (see the module doc).

    Args:
        wrappers: the chain's :class:`SSLTransformsWrapper` objects, in order.

    Returns:
        A new list of wrappers: from the start of the run, a :class:`ToImageTensor`
        wrapper, then each transform's twin, ``ToTensor`` fused with a ``Normalize`` that
        directly follows it. The list unchanged when the chain has no ``ToTensor``
        applied to every entry.
    """
    end = next((i for i, w in enumerate(wrappers) if type(w.transform) is T.ToTensor), None)
    if end is None or wrappers[end].indices:
        return list(wrappers)
    twins: list[TensorTransform] = []
    start = end
    while start > 0:
        previous = wrappers[start - 1]
        twin = None if previous.indices else tensor_twin(previous.transform)
        if twin is None:
            break
        twins.insert(0, twin)
        start -= 1
    mean = std = None
    after = end + 1
    if after < len(wrappers) and _fusable_normalize(wrappers[after]):
        mean, std = wrappers[after].transform.mean, wrappers[after].transform.std
        after += 1
    head = SSLTransformsWrapper(ToImageTensor(), TENSOR_PATH_START, kind="image")
    planned = [
        SSLTransformsWrapper(twin, w.name, w.indices, kind=w.kind, key_path=w.key_path)
        for twin, w in zip(twins, wrappers[start:end])
    ]
    to_tensor = SSLTransformsWrapper(
        TensorToTensor(mean, std), "ToTensor", kind="image", key_path=wrappers[end].key_path
    )
    names = [w.name for w in wrappers[start:after]]
    logger.debug("transforms on tensors: %s", names)
    return [*wrappers[:start], head, *planned, to_tensor, *wrappers[after:]]


def multi_crop_twin(
    crops: Sequence[T.RandomResizedCrop], description: str
) -> TensorTransform | None:
    """The twin of a list of ``RandomResizedCrop`` applied to one image (None unless all
    crops have twins)."""
    twins = [_random_resized_crop(crop) for crop in crops]
    if any(t is None for t in twins):
        return None
    return TensorToMultiCrop(twins, description)  # type: ignore[arg-type]


def copy_with(transform: Any, **attributes: Any) -> Any:
    """A shallow copy of ``transform`` with some attributes replaced."""
    twin = copy.copy(transform)
    for name, value in attributes.items():
        setattr(twin, name, value)
    return twin
