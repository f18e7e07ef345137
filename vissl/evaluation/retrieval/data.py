"""Data sets, image loading and GeM pooling of the instance retrieval benchmark.

Layouts read (``IMG_RETRIEVAL.DATASET_PATH`` = ``ROOT``):

- Revisited Oxford / Paris (``roxford5k``, ``rparis6k``, or any name with the same files):
  ``ROOT/<name>/gnd_<name>.pkl`` (the published ground truth: ``imlist`` (database image
  names), ``qimlist`` (query names), ``gnd``: per query ``{"easy", "hard", "junk"}``
  database indices and ``"bbx"``, the query's box ``[x0, y0, x1, y1]``) and the images
  ``ROOT/<name>/jpg/<image name>.jpg``.
- ``whitening`` (a training set for the PCA whitening only): ``ROOT/whitening/`` and the
  image names (relative to it), one a line, in ``IMG_RETRIEVAL.WHITEN_IMG_LIST``.
- any other training set name: the ``.jpg`` images of ``ROOT/<name>/``, sorted.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

#: the Revisited Oxford / Paris data sets of VISSL
REVISITED_DATASETS = ("roxford5k", "rparis6k")
#: ImageNet's normalisation, used by VISSL's retrieval benchmark
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def is_revisited_dataset(dataset_name: str) -> bool:
    """``roxford5k`` or ``rparis6k``."""
    return dataset_name in REVISITED_DATASETS


def is_whiten_dataset(dataset_name: str) -> bool:
    """The ``whitening`` training set (PCA whitening only)."""
    return dataset_name == "whitening"


# ------------------------------------------------------------------------------ pooling
def l2n(x: torch.Tensor, eps: float = 1e-6, dim: int = 1) -> torch.Tensor:
    """``x / (||x|| + eps)`` along ``dim``."""
    return x / (x.norm(p=2, dim=dim, keepdim=True) + eps)


def add_bias_channel(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x`` with a constant-1 channel appended along ``dim``."""
    shape = list(x.shape)
    shape[dim] = 1
    return torch.cat([x, x.new_ones(shape)], dim)


def gem(
    x: torch.Tensor,
    p: float = 3.0,
    eps: float = 1e-6,
    clamp: bool = True,
    add_bias: bool = False,
    keepdims: bool = False,
) -> torch.Tensor:
    """Generalised-mean pooling of ``(N, C, H, W)`` maps: ``(mean x^p)^(1/p)`` per channel
    (``p = 1``: average, ``p = inf``: max), values clamped at ``eps`` first.

    Returns:
        ``(N, C)`` (``(N, C + 1)`` with ``add_bias``), or ``(N, C, 1, 1)`` with ``keepdims``.
    """
    if p == math.inf or p == "inf":
        x = x.amax(dim=(2, 3), keepdim=True)
    elif p == 1:
        x = x.mean(dim=(2, 3), keepdim=True)
    else:
        if clamp:
            x = x.clamp(min=eps)
        x = x.pow(p).mean(dim=(2, 3), keepdim=True).pow(1.0 / p)
    if add_bias:
        x = add_bias_channel(x)
    return x if keepdims else x.reshape(x.shape[0], -1)


def get_average_gem(
    activation_maps: Sequence[torch.Tensor],
    p: float = 3.0,
    eps: float = 1e-6,
    clamp: bool = True,
    add_bias: bool = False,
    keepdims: bool = False,
) -> torch.Tensor:
    """The mean over ``activation_maps`` (one per image scale) of their :func:`gem`."""
    pooled = [gem(m, p, eps, clamp, add_bias, keepdims) for m in activation_maps]
    return torch.stack(pooled).mean(dim=0)


# ------------------------------------------------------------------------ ground truth
class _GroundTruthUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays only: a ground-truth file cannot run code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"the ground-truth file holds a {module}.{name} object; only lists, dicts, "
            "numbers, strings and numpy arrays are read."
        )


def load_ground_truth(path: str) -> dict[str, Any]:
    """The ``gnd_<name>.pkl`` dict (``imlist``, ``qimlist``, ``gnd``) of a revisited set.

    Raises:
        ValueError: the file is not such a dict.
    """
    with open(path, "rb") as f:
        data = _GroundTruthUnpickler(f).load()
    if not isinstance(data, dict) or not {"imlist", "qimlist", "gnd"} <= set(data):
        raise ValueError(f"{path} is not a revisited ground truth (imlist, qimlist, gnd).")
    if len(data["gnd"]) != len(data["qimlist"]):
        raise ValueError(
            f"{path}: {len(data['gnd'])} gnd entries for {len(data['qimlist'])} queries."
        )
    return data


# ---------------------------------------------------------------------------- data sets
class RevisitedInstanceRetrievalDataset:
    """A Revisited Oxford / Paris data set: database images, queries and ground truth.

    Args:
        dataset: the name (``roxford5k``, ``rparis6k``), the folder under ``dir_main``.
        dir_main: ``IMG_RETRIEVAL.DATASET_PATH``.
        num_samples: keep only the first ``num_samples`` database images and queries.
    """

    def __init__(self, dataset: str, dir_main: str, num_samples: int | None = None) -> None:
        self.dataset = dataset
        self.dir_data = os.path.join(dir_main, dataset)
        self.dir_images = os.path.join(self.dir_data, "jpg")
        self.gnd_fname = os.path.join(self.dir_data, f"gnd_{dataset}.pkl")
        cfg = load_ground_truth(self.gnd_fname)
        self.imlist: list[str] = [str(x) for x in cfg["imlist"]]
        self.qimlist: list[str] = [str(x) for x in cfg["qimlist"]]
        self.gnd: list[dict[str, Any]] = list(cfg["gnd"])
        self.N_images = len(self.imlist)
        self.N_queries = len(self.qimlist)
        if num_samples is not None:
            self.N_images = min(self.N_images, num_samples)
            self.N_queries = min(self.N_queries, num_samples)

    def get_num_images(self) -> int:
        return self.N_images

    def get_num_query_images(self) -> int:
        return self.N_queries

    def get_filename(self, i: int) -> str:
        """The path of database image ``i``."""
        return os.path.join(self.dir_images, f"{self.imlist[i]}.jpg")

    def get_query_filename(self, i: int) -> str:
        """The path of query image ``i``."""
        return os.path.join(self.dir_images, f"{self.qimlist[i]}.jpg")

    def get_query_roi(self, i: int) -> np.ndarray:
        """Query ``i``'s box ``[x0, y0, x1, y1]`` in its image's pixels."""
        return np.asarray(self.gnd[i]["bbx"], dtype=np.float64)


class ImageListDataset:
    """Training images for the PCA whitening: a list of files (``whitening``: the names of
    ``image_list_file`` under ``base_dir``; otherwise the sorted ``.jpg`` files of
    ``base_dir``)."""

    def __init__(
        self, base_dir: str, image_list_file: str = "", num_samples: int | None = None
    ) -> None:
        if image_list_file:
            with open(image_list_file, encoding="utf-8") as f:
                names = [line.strip() for line in f if line.strip()]
        else:
            names = sorted(n for n in os.listdir(base_dir) if n.lower().endswith(".jpg"))
        self.files = [os.path.join(base_dir, n) for n in names]
        if num_samples is not None:
            self.files = self.files[:num_samples]

    def get_num_images(self) -> int:
        return len(self.files)

    def get_filename(self, i: int) -> str:
        return self.files[i]


# ---------------------------------------------------------------------------- images
class InstanceRetrievalImageLoader:
    """Loads an image as a normalised ``(3, H, W)`` tensor.

    The larger side is resized to ``S`` pixels (bilinear; ``S = -1``: the original size),
    or, with ``center_crop``, the shorter side to ``256 / 224 * S`` and a centred
    ``S x S`` crop taken; then ImageNet normalisation. A query box ``roi`` ``[x0, y0, x1,
    y1]`` (original pixels) crops the resized image.
    """

    def __init__(self, S: int, center_crop: bool = False) -> None:
        from torchvision import transforms

        self.S = int(S)
        self.center_crop = bool(center_crop)
        steps: list[Callable[..., Any]] = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
        if self.center_crop:
            steps = [
                transforms.Resize(int((256 / 224) * self.S)),
                transforms.CenterCrop(self.S),
                *steps,
            ]
        self.transforms = transforms.Compose(steps)

    def _ratio(self, height: int, width: int) -> float:
        return 1.0 if self.S == -1 else float(self.S) / max(height, width)

    def load_and_prepare_image(self, fname: str, roi: Any = None) -> torch.Tensor:
        """The image of ``fname`` (cropped to ``roi`` when given), ready for the model."""
        with open(fname, "rb") as f:
            img = Image.open(f).convert("RGB")
        size_hw = np.array([img.size[1], img.size[0]], dtype=np.float64)
        ratio = self._ratio(int(size_hw[0]), int(size_hw[1]))
        if not self.center_crop:
            new_h, new_w = np.round(size_hw * ratio).astype(np.int64).tolist()
            img = img.resize((max(new_w, 1), max(new_h, 1)), Image.Resampling.BILINEAR)
        tensor: torch.Tensor = self.transforms(img)
        if roi is not None:
            x0, y0, x1, y1 = np.round(np.asarray(roi, dtype=np.float64) * ratio).astype(int)
            tensor = tensor[:, y0:y1, x0:x1]
        return tensor


def extract_activation_maps(
    img: torch.Tensor, model: Callable[[torch.Tensor], Any], img_scalings: Sequence[float]
) -> list[torch.Tensor]:
    """The model's first output for ``img`` at each scale (bilinear rescaling; 1: as is)."""
    maps = []
    batch = img.unsqueeze(0)
    for scale in img_scalings:
        inp = batch
        if float(scale) != 1.0:
            inp = F.interpolate(batch, scale_factor=float(scale), mode="bilinear")
        out = model(inp)
        first = out[0] if isinstance(out, list | tuple) else out
        maps.append(first.detach().float().cpu())
    return maps
