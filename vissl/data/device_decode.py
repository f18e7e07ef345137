"""``DATA.TRAIN.DECODE_ON_DEVICE``: JPEG files decoded on the training device (nvJPEG).

With ``TRANSFORMS_ON_DEVICE`` alone the loader workers decode each JPEG, crop, resize and
flip it and hand over ``uint8`` crops (:mod:`vissl.data.ssl_transforms.device_path`). With
``DECODE_ON_DEVICE`` as well the workers only read the file's bytes and draw the crop boxes
and flips, exactly as the worker path draws them: ``RandomResizedCrop``'s box needs only
the image size, read from the JPEG header without decoding, and the same calls consume the
same random numbers (:class:`PlanRandomResizedCrop`, :class:`PlanFlip`). In the train
step's ``read_sample`` :class:`DecodeTail` then decodes the batch's JPEGs with one batched
``torchvision.io.decode_jpeg(..., device=<the task's device>)``, crops, resizes
(bilinear, antialiased) and flips each view there, stacks them into the layout the colour
tail takes (``simclr_collator``: one tensor of ``K * B`` rows, view-major;
``multicrop_collator``: one tensor per crop) and runs the colour tail.

What travels through the collator: the workers' views are not images but *plans*
(:class:`ViewPlan`: the file, a box, an output size, flips), and the batch is packed into
``uint8`` rows that any of the supported collators stacks. ``GenericSSLDataset.__getitems__``
(which the ``DataLoader`` calls with a whole batch) concatenates the batch's files into
one buffer and spreads it over the ``K * B`` rows, each row starting with a 64-byte header
(its view's plan, where its file lies in the buffer, which part of the buffer it carries);
so a batch costs its files' bytes (plus one row of padding), however unequal their sizes.

Only what can be planned without pixels may stay in the workers: ``ImgReplicatePil``,
``ImgPilToMultiCrop``, ``RandomResizedCrop`` (bilinear), ``RandomHorizontalFlip`` and
``RandomVerticalFlip``, at most one crop per view (flips before or after it). Files that
are not JPEGs by their content (ImageNet has one PNG and some CMYK JPEGs under ``.JPEG``
names) are decoded in the worker and travel as pixels; a data set whose file names are not
JPEG names, or a source that does not read files, is a config error.

On a CPU the same code runs with ``decode_jpeg`` on the CPU (libjpeg-turbo, the workers'
decoder) and Pillow-exact ``uint8`` resizes, which makes its crops equal to the worker
path's bit for bit; it exists to test the path, not to speed anything up.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from iopath.common.file_io import g_pathmgr

from vissl.data.data_sources.disk import JPEG_MAGIC, JPEG_SUFFIXES, EncodedImage
from vissl.data.ssl_transforms import tensor_ops
from vissl.data.ssl_transforms.device_path import DeviceTail, ToUint8Tensor
from vissl.data.ssl_transforms.sample_wrapper import SSLTransformsCompose, SSLTransformsWrapper
from vissl.data.ssl_transforms.tensor_path import (
    TensorRandomResizedCrop,
    TensorReplicate,
    TensorToMultiCrop,
    ToImageTensor,
    tensor_twin,
)
from vissl.errors import ConfigError

try:  # deprecated in torchvision 0.29 (for TorchCodec)
    from torchvision.io import ImageReadMode, decode_jpeg
except ImportError:  # pragma: no cover - depends on the torchvision version
    decode_jpeg = None

logger = logging.getLogger(__name__)

#: the transforms the workers may keep (their config names, for messages)
SUPPORTED_HEAD = (
    "ImgReplicatePil",
    "ImgPilToMultiCrop",
    "RandomResizedCrop (bilinear)",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
)

# ------------------------------------------------------------------------ the row format
MAGIC = 0x56444543  # "VDEC"
HEADER_FIELDS = 16
HEADER_BYTES = 4 * HEADER_FIELDS
(
    F_MAGIC,  # MAGIC
    F_ROWS,  # rows of the packing (K * B)
    F_CHUNK,  # which slice of the packed buffer this row's payload is
    F_OFFSET,  # where this row's file lies in the buffer
    F_LENGTH,  # and how many bytes it has
    F_JPEG,  # 1: a JPEG for the device; 0: decoded pixels, (3, H, W) uint8
    F_HEIGHT,  # the image's size
    F_WIDTH,
    F_TOP,  # the view's box in the image
    F_LEFT,
    F_BOX_H,
    F_BOX_W,
    F_OUT_H,  # the view's size
    F_OUT_W,
    F_FLIPS,  # bit 0: horizontal flip, bit 1: vertical flip
    F_VIEW,  # the view's index in its sample
) = range(HEADER_FIELDS)


# ------------------------------------------------------------------ plans in the workers
@dataclasses.dataclass(frozen=True)
class ViewPlan:
    """One view, planned in a worker and made on the device.

    The view is ``image`` cropped to the box (in the file's pixels), resized to
    ``(out_height, out_width)``, then flipped.
    """

    image: EncodedImage
    top: int
    left: int
    height: int
    width: int
    out_height: int
    out_width: int
    hflip: bool = False
    vflip: bool = False
    cropped: bool = False

    @classmethod
    def full(cls, image: EncodedImage) -> ViewPlan:
        h, w = image.height, image.width
        return cls(image, 0, 0, h, w, h, w)

    def flipped(self, horizontal: bool) -> ViewPlan:
        if horizontal:
            return dataclasses.replace(self, hflip=not self.hflip)
        return dataclasses.replace(self, vflip=not self.vflip)

    def crop_resized(
        self, top: int, left: int, height: int, width: int, size: Sequence[int], key_path: str
    ) -> ViewPlan:
        """The box as drawn on the view as it looks now (flipped, maybe), resized."""
        if self.cropped:
            raise ConfigError(
                f"{key_path}=True plans one crop per view in the loader workers; this chain "
                f"crops a view twice. Set {key_path}=False for this chain.",
                key_path,
            )
        if self.hflip:  # a box on the mirrored image is the mirrored box, mirrored
            left = self.image.width - left - width
        if self.vflip:
            top = self.image.height - top - height
        out_h, out_w = int(size[0]), int(size[1])
        return dataclasses.replace(
            self,
            top=top,
            left=left,
            height=height,
            width=width,
            out_height=out_h,
            out_width=out_w,
            cropped=True,
        )


def _shape_only(plan: ViewPlan) -> torch.Tensor:
    """A tensor of the image's shape that holds one byte (for torchvision's get_params)."""
    return torch.empty((), dtype=torch.uint8).expand(3, plan.image.height, plan.image.width)


class PlanStart:
    """The start of the workers' chain: the source's :class:`EncodedImage` as a plan."""

    def __call__(self, image: Any) -> ViewPlan:
        if not isinstance(image, EncodedImage):
            raise TypeError(
                f"DECODE_ON_DEVICE expects an EncodedImage from the data source, got "
                f"{type(image).__name__}"
            )
        return ViewPlan.full(image)

    def __repr__(self) -> str:
        return "PlanStart()"


class PlanRandomResizedCrop:
    """``RandomResizedCrop``: the box from torchvision's own ``get_params`` on the image
    size (the draws of the worker path), the crop and resize left to the device."""

    def __init__(
        self, size: Sequence[int], scale: Sequence[float], ratio: Sequence[float], key_path: str
    ) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.scale = [float(s) for s in scale]
        self.ratio = [float(r) for r in ratio]
        self.key_path = key_path

    def __call__(self, plan: ViewPlan) -> ViewPlan:
        top, left, height, width = T.RandomResizedCrop.get_params(
            _shape_only(plan), self.scale, self.ratio
        )
        return plan.crop_resized(top, left, height, width, self.size, self.key_path)

    def __repr__(self) -> str:
        return f"PlanRandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class PlanMultiCrop:
    """``ImgPilToMultiCrop``: one planned crop per crop, in order."""

    def __init__(self, crops: Sequence[PlanRandomResizedCrop]) -> None:
        self.crops = list(crops)

    def __call__(self, plan: ViewPlan) -> list[ViewPlan]:
        return [crop(plan) for crop in self.crops]

    def __repr__(self) -> str:
        return f"PlanMultiCrop({self.crops!r})"


class PlanFlip:
    """``RandomHorizontalFlip`` / ``RandomVerticalFlip``: the same draw
    (``torch.rand(1) < p``), the flip left to the device."""

    def __init__(self, p: float, horizontal: bool) -> None:
        self.p = float(p)
        self.horizontal = bool(horizontal)

    def __call__(self, plan: ViewPlan) -> ViewPlan:
        if torch.rand(1) < self.p:
            return plan.flipped(self.horizontal)
        return plan

    def __repr__(self) -> str:
        return f"PlanFlip(p={self.p}, {'horizontal' if self.horizontal else 'vertical'})"


def _plan_twin(transform: Any, key_path: str) -> Any:
    twin = transform
    if not isinstance(
        transform,
        TensorRandomResizedCrop | TensorToMultiCrop | TensorReplicate,
    ) and type(transform) not in (T.RandomHorizontalFlip, T.RandomVerticalFlip):
        twin = tensor_twin(transform)
    if type(twin) is TensorRandomResizedCrop:
        return PlanRandomResizedCrop(twin.size, twin.scale, twin.ratio, key_path)
    if type(twin) is TensorToMultiCrop:
        crops = [PlanRandomResizedCrop(c.size, c.scale, c.ratio, key_path) for c in twin.crops]
        return PlanMultiCrop(crops)
    if type(twin) is TensorReplicate:
        return TensorReplicate(twin.num_times)  # references: plans are immutable
    if type(twin) in (T.RandomHorizontalFlip, T.RandomVerticalFlip):
        return PlanFlip(twin.p, horizontal=type(twin) is T.RandomHorizontalFlip)
    return None


def plan_decode_head(head: SSLTransformsCompose, key_path: str) -> SSLTransformsCompose:
    """The workers' chain of ``TRANSFORMS_ON_DEVICE`` (see ``plan_device_path``) as plans.

    Raises:
        ConfigError: naming ``key_path`` when the workers' chain holds a transform that
            needs pixels (anything but the crops and flips of :data:`SUPPORTED_HEAD`).
    """
    wrappers = [SSLTransformsWrapper(PlanStart(), "DecodeOnDevice", kind="image")]
    for wrapper in head.transforms:
        if type(wrapper.transform) in (ToImageTensor, ToUint8Tensor):
            continue
        plan = _plan_twin(wrapper.transform, key_path) if wrapper.kind != "grouping" else None
        if plan is None:
            raise ConfigError(
                f"{key_path}=True leaves only crops and flips to the loader workers "
                f"({', '.join(SUPPORTED_HEAD)}) and decodes on the device, but "
                f"{wrapper.key_path} ({wrapper.name}) runs before the colour transforms and "
                f"needs the pixels. Move it after them, or set {key_path}=False.",
                key_path,
            )
        wrappers.append(
            SSLTransformsWrapper(
                plan, wrapper.name, wrapper.indices, kind=wrapper.kind, key_path=wrapper.key_path
            )
        )
    return SSLTransformsCompose(wrappers)


def _jpeg_name(path: str) -> bool:
    lower = str(path).lower()
    return lower.endswith(JPEG_SUFFIXES) or "." not in lower.rsplit("/", 1)[-1]


def check_decode_sources(sources: Sequence[Any], names: Sequence[str], key_path: str) -> None:
    """The data sources read JPEG files (by their names, and the first file's bytes).

    Raises:
        ConfigError: naming ``key_path``, for a source that does not read files or files
            that are not JPEGs.
    """
    for name, source in zip(names, sources):
        if not callable(getattr(source, "get_encoded_image", None)):
            raise ConfigError(
                f"{key_path}=True decodes JPEG files on the device, but data source {name!r} "
                "does not read image files. Use disk_folder or disk_filelist with JPEG "
                f"files, or set {key_path}=False (TRANSFORMS_ON_DEVICE alone still runs the "
                "colour transforms on the device).",
                key_path,
            )
        paths = [str(p) for p in source.get_image_paths()]
        others = [p for p in paths if not _jpeg_name(p)]
        first = paths[0] if paths else ""
        if not others and first:
            try:
                with g_pathmgr.open(first, "rb") as f:
                    if f.read(3) != JPEG_MAGIC:
                        others = [first]
            except OSError:
                pass  # an unreadable file is the workers' gray image, as without the key
        if others:
            raise ConfigError(
                f"{key_path}=True decodes JPEG files on the device (nvJPEG), but "
                f"{len(others)} of the {len(paths)} files of data source {name!r} are not "
                f"JPEG files, e.g. {others[:3]}. Convert them to JPEG, or set "
                f"{key_path}=False: the loader workers then decode them (TRANSFORMS_ON_DEVICE "
                "still runs the colour transforms on the device).",
                key_path,
            )


# --------------------------------------------------------------------- packing the batch
def pack_views(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each sample's planned views by ``uint8`` rows (see the module doc).

    Sample ``i``'s view ``v`` becomes row ``v * B + i`` of one packing of the ``B`` samples:
    every row has the same length, so the collators stack them; the device side
    (:meth:`DecodeTail.decode`) needs the rows of exactly one packing.
    """
    if not samples:
        return samples
    num_views = len(samples[0]["data"])
    batch = len(samples)
    rows = num_views * batch
    images: list[EncodedImage] = []
    slot: dict[int, int] = {}
    for sample in samples:
        if len(sample["data"]) != num_views:
            raise ValueError(
                f"DECODE_ON_DEVICE: every sample needs the same number of views; got "
                f"{len(sample['data'])} and {num_views}"
            )
        for plan in sample["data"]:
            if not isinstance(plan, ViewPlan):
                raise TypeError(f"DECODE_ON_DEVICE: a view is a {type(plan).__name__}, not a plan")
            if id(plan.image) not in slot:
                slot[id(plan.image)] = len(images)
                images.append(plan.image)
    lengths = [int(img.data.size) for img in images]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    if total >= 2**31:
        raise ValueError(
            f"DECODE_ON_DEVICE: a batch of {total} bytes of files; use a smaller "
            "BATCHSIZE_PER_REPLICA (batches are packed with 32-bit offsets)"
        )
    width = max(1, math.ceil(total / rows))
    packed = np.zeros((rows, HEADER_BYTES + width), dtype=np.uint8)
    payload = packed[:, HEADER_BYTES:]
    for image, start, length in zip(images, offsets[:-1], lengths):
        position, done = int(start), 0
        source = image.data
        while done < length:  # the file's bytes, row after row
            row, column = divmod(position, width)
            n = min(width - column, length - done)
            payload[row, column : column + n] = source[done : done + n]
            position += n
            done += n
    header = np.zeros((rows, HEADER_FIELDS), dtype="<i4")
    header[:, F_MAGIC] = MAGIC
    header[:, F_ROWS] = rows
    header[:, F_CHUNK] = np.arange(rows)
    for i, sample in enumerate(samples):
        for v, plan in enumerate(sample["data"]):
            k = slot[id(plan.image)]
            image = plan.image
            header[v * batch + i] = (
                MAGIC,
                rows,
                v * batch + i,
                offsets[k],
                lengths[k],
                int(image.is_jpeg),
                image.height,
                image.width,
                plan.top,
                plan.left,
                plan.height,
                plan.width,
                plan.out_height,
                plan.out_width,
                int(plan.hflip) | (int(plan.vflip) << 1),
                v,
            )
    packed[:, :HEADER_BYTES] = header.view(np.uint8).reshape(rows, HEADER_BYTES)
    tensor = torch.from_numpy(packed)
    for i, sample in enumerate(samples):
        sample["data"] = [tensor[v * batch + i] for v in range(num_views)]
    return samples


def unpack_rows(rows: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """The ``(N, 16)`` headers and the packed files (one CPU ``uint8`` buffer) of one
    packing's rows (any order), on the CPU."""
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] <= HEADER_BYTES:
        raise ValueError(
            "DECODE_ON_DEVICE: expected the loader's packed uint8 rows, got a tensor of "
            f"{rows.dtype} and shape {tuple(rows.shape)}"
        )
    host = rows.cpu()  # one copy back when the train step moved the batch to the GPU
    header = host[:, :HEADER_BYTES].contiguous().numpy().view("<i4").copy()
    n = host.shape[0]
    if (header[:, F_MAGIC] != MAGIC).any():
        raise ValueError(
            "DECODE_ON_DEVICE: the batch was not packed by the data set's __getitems__ "
            "(its rows have no plan headers)"
        )
    chunks = header[:, F_CHUNK]
    if (header[:, F_ROWS] != n).any() or not np.array_equal(np.sort(chunks), np.arange(n)):
        raise ValueError(
            "DECODE_ON_DEVICE: the batch holds rows of several packings; collate the "
            "samples of one dataset.__getitems__(keys) call (the DataLoader does)"
        )
    payload = host[:, HEADER_BYTES:]
    if np.array_equal(chunks, np.arange(n)):
        buffer = payload.reshape(-1)  # a copy: the rows are strided
    else:
        buffer = payload[torch.from_numpy(np.argsort(chunks))].reshape(-1)
    return header, buffer


# ------------------------------------------------------------------- decoding and crops
def decode_jpegs(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """JPEG files (1-D CPU uint8 tensors) as ``(3, H, W)`` uint8 images on ``device``.

    One batched ``decode_jpeg`` (nvJPEG on CUDA, libjpeg-turbo on the CPU) in RGB mode
    (grey JPEGs come out with three equal channels). When the batch fails (a corrupt or
    unsupported file: ``decode_jpeg`` returns nothing then), each file is decoded alone,
    on the device, else on the CPU, else replaced by a gray image with a warning.
    """
    if not encoded:
        return []
    if decode_jpeg is None:  # pragma: no cover - depends on the torchvision version
        raise RuntimeError("DECODE_ON_DEVICE needs torchvision.io.decode_jpeg")
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders (for TorchCodec) on every call
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))
        except RuntimeError as err:
            logger.warning("DECODE_ON_DEVICE: a batch failed to decode (%s); one by one", err)
        out: list[torch.Tensor | None] = []
        for data in encoded:
            image = None
            for where in dict.fromkeys([device, torch.device("cpu")]):
                try:
                    image = decode_jpeg(data, mode=ImageReadMode.RGB, device=where).to(device)
                    break
                except RuntimeError:
                    continue
            if image is None:
                logger.warning("DECODE_ON_DEVICE: a JPEG could not be decoded; a gray image")
            out.append(image)
        return out


def _resized(
    image: torch.Tensor, box: Sequence[int], size: tuple[int, int], exact_uint8: bool
) -> torch.Tensor:
    """The box ``(top, left, height, width)`` of ``image`` resized to ``size`` (bilinear,
    antialiased): uint8 by Pillow's fixed-point kernel (``exact_uint8``, the CPU: the
    worker path's pixels), else float (``image`` float, rounded later)."""
    top, left, height, width = box
    if exact_uint8:
        return tensor_ops.resized_crop(image, top, left, height, width, size)
    crop = image[:, top : top + height, left : left + width]
    if (height, width) == size:
        return crop
    return F.interpolate(
        crop.unsqueeze(0), size=size, mode="bilinear", antialias=True, align_corners=False
    )[0]


class DecodeTail:
    """Decode, crop, resize and flip a packed batch on the device, then the colour tail.

    Called as the ``TRANSFORMS_ON_DEVICE`` tail is (``tail(inputs, data_idx, epoch)`` in
    ``read_sample``): the device is ``data_idx``'s (the task's device).

    Args:
        colour: the colour tail of the chain (``plan_device_path``).
        key_path: the config key, for messages.
        float_resize: resize in float32 and round (what runs on a GPU); default: on the
            CPU Pillow's uint8 kernel (the worker path's pixels), float elsewhere.
    """

    #: ``read_sample`` calls this tail before moving the sample to the device: the
    #: packed bytes stay on the host, where the decoder reads them.
    takes_host_input = True

    def __init__(
        self,
        colour: DeviceTail,
        key_path: str = "config.DATA.TRAIN.DECODE_ON_DEVICE",
        float_resize: bool | None = None,
    ) -> None:
        self.colour = colour
        self.key_path = key_path
        self.float_resize = float_resize

    @property
    def num_views(self) -> int:
        return self.colour.num_views

    @property
    def names(self) -> list[str]:
        return ["DecodeOnDevice", *self.colour.names]

    def __call__(self, inputs: Any, data_idx: Any, epoch: int) -> Any:
        index = data_idx[0] if isinstance(data_idx, list | tuple) else data_idx
        crops = self.decode(inputs, index.device)
        return self.colour(crops, data_idx, epoch)

    def decode(self, inputs: Any, device: torch.device) -> Any:
        """The ``uint8`` crops of packed rows, in their layout: a tensor of rows gives one
        ``(N, 3, h, w)`` tensor, a list of tensors (one per view) a list."""
        parts = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        sizes = [int(p.shape[0]) for p in parts]
        rows = parts[0] if len(parts) == 1 else torch.cat(parts)
        header, buffer = unpack_rows(rows)
        images = self._images(header, buffer, device)
        exact = not self.float_resize if self.float_resize is not None else device.type == "cpu"
        views: list[torch.Tensor | None] = [None] * len(header)
        for offset, members in _rows_by_image(header).items():
            image = images[offset]
            source = image if exact else image.to(torch.float32)
            for r in members:
                h = header[r]
                box = (int(h[F_TOP]), int(h[F_LEFT]), int(h[F_BOX_H]), int(h[F_BOX_W]))
                views[r] = _resized(source, box, (int(h[F_OUT_H]), int(h[F_OUT_W])), exact)
        outputs = []
        start = 0
        for n in sizes:
            members = list(range(start, start + n))
            shapes = {(int(header[r, F_OUT_H]), int(header[r, F_OUT_W])) for r in members}
            if len(shapes) > 1:
                raise ConfigError(
                    f"{self.key_path}: the views of one batch tensor have different sizes "
                    f"{sorted(shapes)}; use multicrop_collator for crops of several sizes.",
                    "config.DATA.TRAIN.COLLATE_FUNCTION",
                )
            stacked = torch.stack([views[r] for r in members])  # type: ignore[misc]
            flips = header[start : start + n, F_FLIPS]
            stacked = _flip_rows(stacked, flips & 1, dim=-1)
            stacked = _flip_rows(stacked, flips & 2, dim=-2)
            if stacked.dtype != torch.uint8:
                stacked = stacked.round_().clamp_(0.0, 255.0).to(torch.uint8)
            outputs.append(stacked)
            start += n
        return outputs[0] if isinstance(inputs, torch.Tensor) else outputs

    def _images(
        self, header: np.ndarray, buffer: torch.Tensor, device: torch.device
    ) -> dict[int, torch.Tensor]:
        """offset -> the decoded ``(3, H, W)`` uint8 image on ``device``."""
        jpegs: dict[int, torch.Tensor] = {}
        out: dict[int, torch.Tensor] = {}
        groups = _rows_by_image(header)
        for offset, members in groups.items():
            h = header[members[0]]
            data = buffer[offset : offset + int(h[F_LENGTH])]
            if h[F_JPEG]:
                jpegs[offset] = data
            else:
                pixels = data.reshape(3, int(h[F_HEIGHT]), int(h[F_WIDTH]))
                out[offset] = pixels.to(device)
        decoded = decode_jpegs(list(jpegs.values()), device)
        for offset, image in zip(jpegs, decoded):
            first = header[groups[offset][0]]
            shape = (3, int(first[F_HEIGHT]), int(first[F_WIDTH]))
            if image is None:
                image = torch.full(shape, 128, dtype=torch.uint8, device=device)
            elif tuple(image.shape) != shape:
                raise RuntimeError(
                    f"DECODE_ON_DEVICE: a JPEG decoded to {tuple(image.shape)}, its header "
                    f"says {shape}"
                )
            out[offset] = image
        return out

    def __repr__(self) -> str:
        return f"DecodeTail(decode_jpeg, crops, flips; then {self.colour!r})"


def _rows_by_image(header: np.ndarray) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for r, offset in enumerate(header[:, F_OFFSET].tolist()):
        groups.setdefault(int(offset), []).append(r)
    return groups


def _flip_rows(x: torch.Tensor, mask: np.ndarray, dim: int) -> torch.Tensor:
    if not mask.any():
        return x
    if mask.all():
        return x.flip(dim)
    rows = torch.from_numpy(np.flatnonzero(mask)).to(x.device)
    x[rows] = x[rows].flip(dim)
    return x
