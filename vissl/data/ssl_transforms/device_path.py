"""The colour half of the augmentations, batched on the training device.

With ``DATA.TRAIN.TRANSFORMS_ON_DEVICE: True`` the loader workers run the transforms up to
the last geometric one (decode, crops, flips) and hand over ``uint8`` crops; the colour
transforms after it (``ColorJitter`` and ``ImgPilColorDistortion``, ``RandomGrayscale``,
``ImgPilGaussianBlur``, ``ImgPilRandomSolarize``, ``RandomApply`` / ``Compose`` of them,
then ``ToTensor`` and ``Normalize``) run in the train step's ``read_sample`` on the whole
batch at once, on the task's device (a GPU: a few elementwise kernels and two small
convolutions per batch instead of a CPU worker's per-image work; four times fewer bytes
copied to the device, ``uint8`` instead of ``float32``).

Each operation is the batched form of the tensor path's twin
(:mod:`vissl.data.ssl_transforms.tensor_ops`, Pillow's formulas), with its parameters per
row: the same distributions as the worker-side chain (``ColorJitter``'s random order and
factors, the probabilities, the blur radius, the solarize threshold). The random numbers
are not drawn from a generator: each is a hash of (``SEED_VALUE``, epoch, sample index,
view, draw) computed on the device, so a batch's augmentations do not depend on the rank,
the worker or the batch composition, nothing is read back to the host, and a resumed run
repeats them exactly.

Views: with ``simclr_collator`` the input is one tensor of ``K * B`` rows, view-major
(row ``v * B + i`` is view ``v`` of sample ``i``); with ``multicrop_collator`` a list of
``K`` tensors of ``B`` rows, tensor ``v`` holding view ``v``. Transforms restricted to some
views (``transform_indices``) apply to those rows only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from vissl.data.ssl_transforms import tensor_ops
from vissl.data.ssl_transforms.img_pil_gaussian_blur import ImgPilGaussianBlur
from vissl.data.ssl_transforms.img_pil_multicrop_random_apply import ImgPilMultiCropRandomApply
from vissl.data.ssl_transforms.img_pil_random_solarize import ImgPilRandomSolarize
from vissl.data.ssl_transforms.sample_wrapper import SSLTransformsCompose, SSLTransformsWrapper
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.data.ssl_transforms.tensor_path import (
    TensorColorJitter,
    TensorCompose,
    TensorRandomApply,
    TensorRandomGrayscale,
    TensorToTensor,
    ToImageTensor,
    tensor_twin,
)
from vissl.errors import ConfigError

_M32 = 0xFFFFFFFF
_LUMA = tensor_ops.LUMA_WEIGHTS


# ----------------------------------------------------------------------------- hashing
def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``(x * constant) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without overflow."""
    lo, hi = constant & 0xFFFF, constant >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _fmix32_int(x: int) -> int:
    """:func:`_fmix32` of one Python int (host side: no device copy)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def hash_uniforms(
    seed: int, epoch: int, index: torch.Tensor, view: torch.Tensor, draws: int
) -> torch.Tensor:
    """``(N, draws)`` float32 numbers in ``[0, 1)``, a function of (seed, epoch, index,
    view, draw) only (24 random bits each), computed where ``index`` lives."""
    device = index.device
    # (seed, epoch) on the host: a Python int, no host-to-device copy per batch
    base = _fmix32_int(_fmix32_int(seed * 0x9E3779B1 + 0x7F4A7C15) ^ (epoch & _M32))
    row = _fmix32(base ^ (index.to(torch.int64) & _M32))
    row = _fmix32(row ^ _mul32(view.to(torch.int64) + 1, 0x27D4EB2F))
    slots = _fmix32(torch.arange(1, draws + 1, device=device, dtype=torch.int64) * 0x61C88647)
    bits = _fmix32(row[:, None] ^ (slots[None, :] & _M32))
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))


# ------------------------------------------------------------------- batched operations
def _col(values: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1, 1, 1, 1)


def luma(x: torch.Tensor) -> torch.Tensor:
    """``(N, 1, H, W)`` grey levels of float images (Pillow's ``L`` weights)."""
    if x.shape[1] == 1:
        return x
    return x[:, 0:1] * _LUMA[0] + x[:, 1:2] * _LUMA[1] + x[:, 2:3] * _LUMA[2]


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * _col(factor)).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    means = x.mean(dim=(2, 3))  # (N, C)
    if x.shape[1] == 1:
        mean = means[:, 0]
    else:
        mean = means[:, 0] * _LUMA[0] + means[:, 1] * _LUMA[1] + means[:, 2] * _LUMA[2]
    mean = torch.floor(mean * 255.0 + 0.5) / 255.0  # Pillow's 8-bit degenerate image
    f = _col(factor)
    return (x * f + (1.0 - f) * _col(mean)).clamp_(0.0, 1.0)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    f = _col(factor)
    return (x * f + luma(x) * (1.0 - f)).clamp_(0.0, 1.0)


def adjust_hue(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Hue rotation by whole 1/255 turns (:func:`tensor_ops.adjust_hue_`, per row)."""
    if x.shape[1] == 1:
        return x
    shift = torch.remainder(torch.trunc(factor * tensor_ops.HUE_STEPS) / tensor_ops.HUE_STEPS, 1.0)
    s = shift.reshape(-1, 1, 1)
    red, green, blue = x[:, 0], x[:, 1], x[:, 2]
    high = torch.maximum(torch.maximum(red, green), blue)
    chroma = high - torch.minimum(torch.minimum(red, green), blue)
    is_red = (red - high).sign().add(1.0)
    is_green = (green - high).sign().add(1.0).mul(1.0 - is_red)
    is_blue = 1.0 - is_red - is_green
    hue = (green - blue) * is_red
    hue = hue + (blue - red + 2.0 * chroma) * is_green
    hue = hue + (red - green + 4.0 * chroma) * is_blue
    hue = hue / chroma.clamp(min=1e-12) + (6.0 * s + 6.0)
    hue = hue - 6.0 * torch.floor(hue * (1.0 / 6.0))
    top = high + chroma
    out = torch.stack(
        [
            (high - 2.0 * chroma) + (hue - 3.0).abs().clamp(1.0, 2.0) * chroma,
            top - (hue - 2.0).abs().clamp(1.0, 2.0) * chroma,
            top - (hue - 4.0).abs().clamp(1.0, 2.0) * chroma,
        ],
        dim=1,
    )
    return torch.where(_col(shift) == 0.0, x, out)


def grayscale(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(_col(mask), luma(x).expand_as(x), x)


def _box_kernels(radius: torch.Tensor, half: int) -> torch.Tensor:
    """``(N, 2 half + 1)``: each row's extended box of Pillow's ``GaussianBlur(radius)``
    (:func:`tensor_ops._box_weights`, 3 passes; radius 0 is the identity)."""
    sigma2 = radius.to(torch.float64) ** 2 / 3.0
    length = torch.sqrt(12.0 * sigma2 + 1.0)
    whole = torch.floor((length - 1.0) / 2.0)
    frac = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2)
    frac = frac / (6 * (sigma2 - (whole + 1) ** 2))
    norm = 2.0 * (whole + frac) + 1.0
    offsets = torch.arange(-half, half + 1, device=radius.device, dtype=torch.float64).abs()
    w = whole[:, None]
    inner = (offsets[None, :] <= w).to(torch.float64) / norm[:, None]
    edge = (offsets[None, :] == w + 1).to(torch.float64) * (frac / norm)[:, None]
    return (inner + edge).to(torch.float32)


def gaussian_blur(x: torch.Tensor, radius: torch.Tensor, radius_max: float) -> torch.Tensor:
    """Pillow's ``GaussianBlur(radius)`` per row (3 extended box passes per direction,
    edges replicated each pass)."""
    n, c, h, w = x.shape
    half = math.floor((math.sqrt(4.0 * radius_max**2 + 1.0) - 1.0) / 2.0) + 1
    kernel = _box_kernels(radius, half).repeat_interleave(c, dim=0)  # (N*C, L)
    out = x.reshape(1, n * c, h, w)
    vertical = kernel[:, None, :, None]
    horizontal = kernel[:, None, None, :]
    for _ in range(3):
        out = F.conv2d(F.pad(out, (0, 0, half, half), mode="replicate"), vertical, groups=n * c)
    for _ in range(3):
        out = F.conv2d(F.pad(out, (half, half, 0, 0), mode="replicate"), horizontal, groups=n * c)
    return out.reshape(n, c, h, w)


def solarize(x: torch.Tensor, threshold: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Invert where the 8-bit value is >= ``threshold`` (0..256; 256 inverts nothing)."""
    limit = _col((threshold - 0.5) / 255.0)
    return torch.where(_col(mask) & (x >= limit), 1.0 - x, x)


# ------------------------------------------------------------------------ the operations
class DeviceOp:
    """One transform of the colour tail: ``slots`` random numbers per row."""

    slots = 0

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        """``x`` (N, C, H, W) float; ``u`` (N, slots); ``active`` (N,) bool: rows it may
        change; ``view`` (N,): each row's view (crop) index."""
        raise NotImplementedError


class ComposeOp(DeviceOp):
    def __init__(self, ops: Sequence[DeviceOp]) -> None:
        self.ops = list(ops)
        self.slots = sum(op.slots for op in self.ops)

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        start = 0
        for op in self.ops:
            x = op.apply(x, u[:, start : start + op.slots], active, view)
            start += op.slots
        return x

    def __repr__(self) -> str:
        return f"ComposeOp({self.ops!r})"


class RandomApplyOp(ComposeOp):
    """``RandomApply``: applied when ``rand <= p`` (the twin skips on ``p < rand``)."""

    def __init__(self, ops: Sequence[DeviceOp], p: float) -> None:
        super().__init__(ops)
        self.p = float(p)
        self.slots += 1

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        return super().apply(x, u[:, 1:], active & (u[:, 0] <= self.p), view)

    def __repr__(self) -> str:
        return f"RandomApplyOp(p={self.p}, {self.ops!r})"


class ViewsOp(ComposeOp):
    """A transform restricted to some views (``transform_indices``)."""

    def __init__(self, op: DeviceOp, views: Sequence[int]) -> None:
        super().__init__([op])
        self.views = tuple(int(v) for v in views)

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        allowed = torch.zeros_like(active)
        for v in self.views:
            allowed |= view == v
        return super().apply(x, u, active & allowed, view)

    def __repr__(self) -> str:
        return f"ViewsOp(views={self.views}, {self.ops[0]!r})"


class MultiCropRandomApplyOp(ComposeOp):
    """``ImgPilMultiCropRandomApply``: applied to a crop when ``rand < prob`` of its type."""

    def __init__(self, ops: Sequence[DeviceOp], view_probs: Sequence[float]) -> None:
        super().__init__(ops)
        self.view_probs = [float(p) for p in view_probs]
        self.slots += 1
        self._probs: dict[torch.device, torch.Tensor] = {}  # copied once per device

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        probs = self._probs.get(x.device)
        if probs is None:
            probs = self._probs[x.device] = torch.tensor(self.view_probs, device=x.device)
        prob = probs[view.clamp(max=len(self.view_probs) - 1)]
        prob = torch.where(view < len(self.view_probs), prob, torch.zeros_like(prob))
        return super().apply(x, u[:, 1:], active & (u[:, 0] < prob), view)

    def __repr__(self) -> str:
        return f"MultiCropRandomApplyOp(probs per crop={self.view_probs}, {self.ops!r})"


def _range(value: Any) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


class ColorJitterOp(DeviceOp):
    """``ColorJitter``: a random order of the four adjustments, factors drawn uniformly
    from the ranges (``ColorJitter.get_params``); an inactive row gets neutral factors."""

    slots = 8  # 4 for the order, 4 for the factors

    def __init__(self, brightness: Any, contrast: Any, saturation: Any, hue: Any) -> None:
        self.ranges = [_range(brightness), _range(contrast), _range(saturation), _range(hue)]

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        order = torch.argsort(u[:, :4], dim=1)  # a uniformly random permutation per row
        neutral = (1.0, 1.0, 1.0, 0.0)
        factors: list[torch.Tensor | None] = []
        for j, bounds in enumerate(self.ranges):
            if bounds is None:
                factors.append(None)
                continue
            lo, hi = bounds
            factors.append(lo + (hi - lo) * u[:, 4 + j])
        adjust = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
        for position in range(4):
            for j in range(4):
                factor = factors[j]
                if factor is None:
                    continue
                chosen = active & (order[:, position] == j)
                x = adjust[j](x, torch.where(chosen, factor, neutral[j]))
        return x

    def __repr__(self) -> str:
        return f"ColorJitterOp(ranges={self.ranges})"


class GrayscaleOp(DeviceOp):
    """``RandomGrayscale``: applied when ``rand < p``."""

    slots = 1

    def __init__(self, p: float) -> None:
        self.p = float(p)

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        return grayscale(x, active & (u[:, 0] < self.p))

    def __repr__(self) -> str:
        return f"GrayscaleOp(p={self.p})"


class GaussianBlurOp(DeviceOp):
    """``ImgPilGaussianBlur``: applied when ``rand <= p``, radius uniform in the range."""

    slots = 2

    def __init__(self, p: float, radius_min: float, radius_max: float) -> None:
        self.p, self.radius_min, self.radius_max = float(p), float(radius_min), float(radius_max)

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        radius = self.radius_min + (self.radius_max - self.radius_min) * u[:, 1]
        radius = torch.where(active & (u[:, 0] <= self.p), radius, torch.zeros_like(radius))
        return gaussian_blur(x, radius, max(self.radius_max, self.radius_min, 0.0))

    def __repr__(self) -> str:
        return f"GaussianBlurOp(p={self.p}, radius=[{self.radius_min}, {self.radius_max}])"


class SolarizeOp(DeviceOp):
    """``ImgPilRandomSolarize``: applied when ``rand < p``, threshold uniform in 0..256."""

    slots = 2

    def __init__(self, p: float) -> None:
        self.p = float(p)

    def apply(
        self, x: torch.Tensor, u: torch.Tensor, active: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        threshold = torch.floor(u[:, 1] * 257.0)
        return solarize(x, threshold, active & (u[:, 0] < self.p))

    def __repr__(self) -> str:
        return f"SolarizeOp(p={self.p})"


def device_op(twin: Any) -> DeviceOp | None:
    """The batched form of a tensor-path twin, or None when it has none."""
    kind = type(twin)
    if kind is ImgPilMultiCropRandomApply:
        ops = [device_op(t) for t in twin.transforms]
        if any(op is None for op in ops):
            return None
        probs = [twin.prob[t] for t in twin.crop_types]
        return MultiCropRandomApplyOp([op for op in ops if op is not None], probs)
    if kind in (TensorCompose, TensorRandomApply):
        ops = [device_op(t) for t in twin.transforms]
        if any(op is None for op in ops):
            return None
        inner: list[DeviceOp] = [op for op in ops if op is not None]
        return ComposeOp(inner) if kind is TensorCompose else RandomApplyOp(inner, twin.p)
    if kind is TensorColorJitter:
        return ColorJitterOp(twin.brightness, twin.contrast, twin.saturation, twin.hue)
    if kind is TensorRandomGrayscale:
        return GrayscaleOp(twin.p)
    if kind is ImgPilGaussianBlur:
        return GaussianBlurOp(twin.prob, twin.radius_min, twin.radius_max)
    if kind is ImgPilRandomSolarize:
        return SolarizeOp(twin.p)
    return None


class DeviceTail:
    """The colour transforms of a chain, applied to a collated ``uint8`` batch.

    Args:
        ops: the transforms, in order (see :func:`device_op`).
        mean, std: the ``Normalize`` after ``ToTensor`` (None: none).
        num_views: views per sample (to find each row's view in a one-tensor batch).
        seed: ``SEED_VALUE``.
        names: the config names of the transforms moved here (for messages).
    """

    def __init__(
        self,
        ops: Sequence[DeviceOp],
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        num_views: int,
        seed: int,
        names: Sequence[str] = (),
    ) -> None:
        self.op = ComposeOp(ops)
        self.mean = None if mean is None else [float(m) for m in mean]
        self.std = None if std is None else [float(s) for s in std]
        self.num_views = int(num_views)
        self.seed = int(seed)
        self.names = list(names)
        self._norm: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _one(
        self, x: torch.Tensor, index: torch.Tensor, view: torch.Tensor, epoch: int
    ) -> torch.Tensor:
        if x.dtype != torch.uint8:
            raise TypeError(
                f"DATA.TRAIN.TRANSFORMS_ON_DEVICE expects uint8 crops from the loader, got "
                f"{x.dtype}"
            )
        out = x.to(torch.float32).div_(255.0)
        if self.op.slots:
            u = hash_uniforms(self.seed, epoch, index, view, self.op.slots)
            active = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
            out = self.op.apply(out, u, active, view)
        if self.mean is not None and self.std is not None:
            norm = self._norm.get(x.device)
            if norm is None:  # copied to the device once, not per batch
                norm = self._norm[x.device] = (
                    torch.tensor(self.mean, device=x.device).reshape(1, -1, 1, 1),
                    torch.tensor(self.std, device=x.device).reshape(1, -1, 1, 1),
                )
            out = (out - norm[0]) / norm[1]
        return out.contiguous()

    def __call__(self, inputs: Any, data_idx: torch.Tensor, epoch: int) -> Any:
        """The augmented float batch: ``inputs`` as collated (a tensor of ``K * B`` rows,
        view-major, or a list of ``K`` tensors of ``B`` rows); ``data_idx`` the rows'
        sample indices (``K * B``, view-major)."""
        if isinstance(data_idx, list | tuple):  # one entry per data source
            data_idx = data_idx[0]
        index = data_idx.reshape(-1).to(torch.int64)
        if isinstance(inputs, torch.Tensor):
            rows = inputs.shape[0]
            if rows % self.num_views or index.numel() != rows:
                raise ValueError(
                    f"a batch of {rows} rows with data_idx of {index.numel()} for "
                    f"{self.num_views} views per sample"
                )
            per_view = rows // self.num_views
            view = torch.arange(rows, device=index.device) // per_view
            return self._one(inputs, index.to(inputs.device), view.to(inputs.device), epoch)
        outputs = []
        start = 0
        for v, x in enumerate(inputs):
            rows = x.shape[0]
            idx = index[start : start + rows].to(x.device)
            view = torch.full((rows,), v, dtype=torch.int64, device=x.device)
            outputs.append(self._one(x, idx, view, epoch))
            start += rows
        return outputs

    def __repr__(self) -> str:
        norm = "" if self.mean is None else f", normalize mean={self.mean} std={self.std}"
        return f"DeviceTail({self.op.ops!r}{norm}, views={self.num_views})"


class ToUint8Tensor:
    """The end of the worker's part: each crop as a contiguous ``uint8`` ``(C, H, W)``."""

    def __call__(self, image: Any) -> torch.Tensor:
        if not isinstance(image, torch.Tensor):
            image = ToImageTensor()(image)
        if image.dtype != torch.uint8:
            image = (image * 255.0).round_().clamp_(0, 255).to(torch.uint8)
        return image.contiguous()

    def __repr__(self) -> str:
        return "ToUint8Tensor()"


#: the collators whose batch layout :class:`DeviceTail` knows (see the module doc)
SUPPORTED_COLLATORS = ("simclr_collator", "multicrop_collator", "default_collate")


def plan_device_path(
    compose: Any, seed: int, key_path: str, count_views: Callable[[Any], int] | None = None
) -> tuple[Any, DeviceTail]:
    """Split a built chain (on the tensor path) into the workers' part and the device tail.

    Returns:
        The workers' chain (up to the last transform without a batched form, then
        :class:`ToUint8Tensor`) and the :class:`DeviceTail` of the rest.

    Args:
        compose: the built chain.
        seed: ``SEED_VALUE``.
        key_path: the config key, for messages.
        count_views: the number of views per sample the workers' chain makes (default:
            counted on a small grey image).

    Raises:
        ConfigError: naming ``key_path`` when the chain does not end with ``ToTensor``
            (and ``Normalize``) on the tensor path, or when a moved transform names crops
            the chain does not make.
    """
    wrappers = list(compose.transforms)
    if not wrappers or type(wrappers[-1].transform) is not TensorToTensor or wrappers[-1].indices:
        raise ConfigError(
            f"{key_path}=True moves the colour transforms and ToTensor/Normalize to the "
            "device: the chain must end with ToTensor (and Normalize) applied to every crop, "
            "and FAST_TRANSFORMS must be on. Got: "
            f"{[w.name for w in wrappers]}.",
            key_path,
        )
    to_tensor = wrappers[-1].transform
    ops: list[DeviceOp] = []
    start = len(wrappers) - 1
    while start > 0:
        wrapper = wrappers[start - 1]
        if type(wrapper.transform) is ToImageTensor:
            start -= 1  # the start of the tensor path: ToUint8Tensor converts anyway
            continue
        # a tensor-path twin, or a transform the tensor path left on PIL (one restricted
        # to some crops), through its twin
        op = device_op(wrapper.transform)
        if op is None:
            twin = tensor_twin(wrapper.transform)
            op = device_op(twin) if twin is not None else None
        if op is None:
            break
        # (a grouping transform sees all crops: its indices do not restrict it)
        restricted = wrapper.indices and wrapper.kind == "image"
        ops.insert(0, ViewsOp(op, wrapper.indices) if restricted else op)
        start -= 1
    names = [w.name for w in wrappers[start:] if type(w.transform) is not ToImageTensor]
    head = SSLTransformsCompose(
        [*wrappers[:start], SSLTransformsWrapper(ToUint8Tensor(), "ToUint8Tensor", kind="image")]
    )
    num_views = (count_views or _count_views)(head)
    _check_views(ops, num_views, key_path)
    tail = DeviceTail(ops, to_tensor.mean, to_tensor.std, num_views, seed, names)
    return head, tail


def _check_views(ops: Sequence[DeviceOp], num_views: int, key_path: str) -> None:
    """The crops a moved transform names exist (the workers would raise for them too)."""
    for op in ops:
        if isinstance(op, ViewsOp) and max(op.views) >= num_views:
            raise ConfigError(
                f"{key_path}: a transform restricted to crops {list(op.views)} but the chain "
                f"makes {num_views} crops per sample.",
                key_path,
            )
        if isinstance(op, MultiCropRandomApplyOp) and len(op.view_probs) != num_views:
            raise ConfigError(
                f"{key_path}: ImgPilMultiCropRandomApply is set for {len(op.view_probs)} "
                f"crops (total_nmb_crops) but the chain makes {num_views} per sample.",
                key_path,
            )
        _check_views(getattr(op, "ops", []), num_views, key_path)


def _count_views(head: Any) -> int:
    """Views per sample the workers' chain makes (one run on a small grey image)."""
    item = {"data": [Image.new("RGB", (48, 40), (120, 90, 60))], "data_valid": [1], "data_idx": [0]}
    item["label"] = [0]
    with seeded_rng(0):
        out = head(item)
    return len(out["data"])
