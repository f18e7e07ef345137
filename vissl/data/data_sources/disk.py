"""``disk_folder`` (class-per-folder images) and ``disk_filelist`` (.npy of paths)."""

from __future__ import annotations

import dataclasses
import io
import logging
import warnings
from typing import Any

import numpy as np
import torch
from iopath.common.file_io import g_pathmgr
from PIL import Image
from torchvision.datasets import ImageFolder

from vissl.config.attr_dict import AttrDict
from vissl.data.data_helper import (
    get_mean_image,
    load_array_file,
    split_cfg_value,
)
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource
from vissl.data.ssl_transforms.tensor_ops import pil_to_uint8
from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

#: The first bytes of every JPEG file (SOI marker and the next marker's 0xFF).
JPEG_MAGIC = b"\xff\xd8\xff"
#: File name endings of JPEG files (compared in lower case).
JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")
#: The PIL modes of the JPEGs handed over undecoded (``DECODE_ON_DEVICE``); others
#: (CMYK, YCCK) are decoded in the worker.
_DEVICE_JPEG_MODES = ("RGB", "L")


@dataclasses.dataclass(frozen=True, eq=False)  # compared by identity (data is an array)
class EncodedImage:
    """An image as a loader worker hands it to the device decoder (``DECODE_ON_DEVICE``).

    Attributes:
        data: 1-D uint8 array: the JPEG file's bytes (``is_jpeg``), or else the decoded
            ``(3, height, width)`` pixels in C order.
        height: the image's height (read from the JPEG header, not decoded).
        width: the image's width.
        is_jpeg: whether ``data`` is a JPEG file for the device to decode.
    """

    data: np.ndarray
    height: int
    width: int
    is_jpeg: bool

    @classmethod
    def from_pixels(cls, pixels: torch.Tensor) -> EncodedImage:
        """An image decoded already: ``(C, H, W)`` uint8 (one channel is made three)."""
        if pixels.shape[0] == 1:
            pixels = pixels.expand(3, -1, -1)
        data = pixels.contiguous().numpy().reshape(-1)
        return cls(data, int(pixels.shape[1]), int(pixels.shape[2]), False)


try:  # deprecated in torchvision 0.29 in favour of TorchCodec; PIL decodes once it is gone
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as _torchvision_decode_jpeg
except ImportError:  # pragma: no cover - depends on the torchvision version
    _torchvision_decode_jpeg = None


def _decode_jpeg(data: bytes) -> torch.Tensor | None:
    """JPEG bytes as a (3, H, W) uint8 tensor by torchvision's libjpeg-turbo decoder.

    None when torchvision cannot decode it (no decoder in this build, or a file it
    rejects): the caller then lets PIL decode it, or report it unreadable.
    """
    if _torchvision_decode_jpeg is None:
        return None
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its decoders (for TorchCodec) on every call
            warnings.simplefilter("ignore", DeprecationWarning)
            return _torchvision_decode_jpeg(encoded, mode=ImageReadMode.RGB)  # type: ignore[no-any-return]
    except RuntimeError:
        return None


class DiskImageDataset(DataSource):
    """Shared image reading: a file that cannot be read gives VISSL's gray image.

    An unreadable image is replaced by a gray ``DEFAULT_GRAY_IMG_SIZE`` image and
    reported as invalid (``data_valid`` -1 in the sample), with a warning.

    ``get_image_tensor(idx)`` reads the same image as a ``(3, H, W)`` uint8 tensor, for
    transform chains that start on tensors (see ``GenericSSLDataset``): JPEGs are decoded
    by torchvision's libjpeg-turbo decoder straight into the tensor (the same pixels as
    PIL's libjpeg-turbo, about 20% faster, and no copy out of a PIL image); other formats
    go through PIL.

    ``get_encoded_image(idx)`` (``DATA.TRAIN.DECODE_ON_DEVICE``) reads the file without
    decoding it: a JPEG of RGB or grey pixels comes back as its bytes and its size from
    the header; anything else (a file that is no JPEG whatever its name, a CMYK JPEG, an
    unreadable file) is decoded here exactly as ``get_image_tensor`` decodes it.
    """

    def _image_path(self, idx: int) -> str:
        raise NotImplementedError

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        return self._read_image(self._image_path(idx))

    def get_image_tensor(self, idx: int) -> tuple[torch.Tensor, bool]:
        """Image ``idx`` as a ``(3, H, W)`` uint8 tensor, and whether it could be read."""
        return self._read_tensor(self._image_path(idx))

    def get_encoded_image(self, idx: int) -> tuple[EncodedImage, bool]:
        """Image ``idx`` undecoded where it is a JPEG (see the class doc), and whether it
        could be read."""
        return self._read_encoded(self._image_path(idx))

    def _read_encoded(self, image_path: str) -> tuple[EncodedImage, bool]:
        try:
            with g_pathmgr.open(image_path, "rb") as f:
                data = f.read()
        except Exception as err:  # missing or unreadable: the gray image, as below
            logger.warning("Couldn't load image %s (%s); using a gray image.", image_path, err)
            return EncodedImage.from_pixels(pil_to_uint8(get_mean_image(self.gray_img_size))), False
        if data[:3] == JPEG_MAGIC:
            try:
                with Image.open(io.BytesIO(data)) as img:  # parses the header only
                    width, height = img.size
                    mode = img.mode
            except Exception:  # a header PIL rejects: decoded (or reported) below
                mode = ""
            if mode in _DEVICE_JPEG_MODES:
                return EncodedImage(np.frombuffer(data, dtype=np.uint8), height, width, True), True
        else:
            logger.warning(
                "%s is not a JPEG file (DECODE_ON_DEVICE): decoded in the loader worker.",
                image_path,
            )
        pixels, valid = self._decode_bytes(data, image_path)
        return EncodedImage.from_pixels(pixels), valid

    def _read_tensor(self, image_path: str) -> tuple[torch.Tensor, bool]:
        try:
            with g_pathmgr.open(image_path, "rb") as f:
                data = f.read()
        except Exception as err:  # any unreadable file: corrupt, missing, wrong format
            logger.warning("Couldn't load image %s (%s); using a gray image.", image_path, err)
            return pil_to_uint8(get_mean_image(self.gray_img_size)), False
        return self._decode_bytes(data, image_path)

    def _decode_bytes(self, data: bytes, image_path: str) -> tuple[torch.Tensor, bool]:
        try:
            decoded = _decode_jpeg(data) if data[:3] == JPEG_MAGIC else None
            if decoded is None:  # not a JPEG, or one for PIL to try (and to judge)
                with Image.open(io.BytesIO(data)) as img:
                    decoded = pil_to_uint8(img.convert("RGB"))
            return decoded, True
        except Exception as err:  # any unreadable file: corrupt, missing, wrong format
            logger.warning("Couldn't load image %s (%s); using a gray image.", image_path, err)
            return pil_to_uint8(get_mean_image(self.gray_img_size)), False

    def _read_image(self, image_path: str) -> tuple[Image.Image, bool]:
        try:
            with g_pathmgr.open(image_path, "rb") as f:
                img = Image.open(f)
                img.load()  # decode while the file is open
            # most JPEGs are RGB already: no copy then
            return (img if img.mode == "RGB" else img.convert("RGB")), True
        except Exception as err:  # any unreadable file: corrupt, missing, wrong format
            logger.warning("Couldn't load image %s (%s); using a gray image.", image_path, err)
            return get_mean_image(self.gray_img_size), False


@register_data_source("disk_folder")
class DiskFolderDataset(DiskImageDataset):
    """Images in ``<path>/<class_name>/<image>``, like torchvision's ``ImageFolder``.

    Its own labels (``LABEL_TYPE: standard`` or ``LABEL_SOURCES: [disk_folder]``) are
    the class indices, classes sorted by folder name.
    """

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "disk_folder",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        if not isinstance(path, str) or not path or not g_pathmgr.isdir(path):
            raise ConfigError(
                f"{self.key_path}: directory {path!r} for data source {data_source!r} "
                "does not exist. Give a folder with one sub-folder of images per class.",
                self.key_path,
            )
        try:
            folder = ImageFolder(g_pathmgr.get_local_path(path))
        except (FileNotFoundError, RuntimeError) as err:
            raise ConfigError(
                f"{self.key_path}: no images found in {path!r}: {err}", self.key_path
            ) from err
        self.classes: list[str] = list(folder.classes)
        self.class_to_idx: dict[str, int] = dict(folder.class_to_idx)
        self.samples: list[tuple[str, int]] = list(folder.samples)
        logger.info("Loaded %d images from folder %s", len(self.samples), path)

    def __len__(self) -> int:
        return len(self.samples)

    def _image_path(self, idx: int) -> str:
        return self.samples[idx][0]

    def get_labels(self) -> np.ndarray:
        return np.asarray([label for _, label in self.samples], dtype=np.int64)

    def get_image_paths(self) -> list[str]:
        return [p for p, _ in self.samples]


@register_data_source("disk_filelist")
class DiskFilelistDataset(DiskImageDataset):
    """Images listed in a ``.npy`` file of paths (memory-mapped when ``MMAP_MODE``).

    ``REMOVE_IMG_PATH_PREFIX`` / ``NEW_IMG_PATH_PREFIX`` rewrite the listed paths.
    Labels come from ``LABEL_SOURCES: [disk_filelist]`` with a ``.npy`` in
    ``LABEL_PATHS``; the source itself has none.
    """

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "disk_filelist",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        self.mmap = bool(split_cfg_value(self.split_cfg, "MMAP_MODE", True))
        self._remove_prefix = str(split_cfg_value(self.split_cfg, "REMOVE_IMG_PATH_PREFIX", ""))
        self._new_prefix = str(split_cfg_value(self.split_cfg, "NEW_IMG_PATH_PREFIX", ""))
        files = load_array_file(path, mmap=self.mmap, key_path=self.key_path)
        if files.ndim != 1:
            raise ConfigError(
                f"{self.key_path}: {path!r} must hold a 1-D list of image paths, "
                f"got shape {files.shape}.",
                self.key_path,
            )
        self._num_samples = len(files)
        # Loaded lazily again in each worker, so workers do not pickle the list.
        self._files: np.ndarray | None = None

    def _image_files(self) -> np.ndarray:
        if self._files is None:
            self._files = load_array_file(self.path, mmap=self.mmap, key_path=self.key_path)
        return self._files

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_files"] = None
        return state

    def _resolve(self, image_path: str) -> str:
        if self._remove_prefix and image_path.startswith(self._remove_prefix):
            return self._new_prefix + image_path[len(self._remove_prefix) :]
        return image_path

    def __len__(self) -> int:
        return self._num_samples

    def _image_path(self, idx: int) -> str:
        return self._resolve(str(self._image_files()[idx]))

    def get_image_paths(self) -> list[str]:
        return [self._resolve(str(p)) for p in self._image_files()]
