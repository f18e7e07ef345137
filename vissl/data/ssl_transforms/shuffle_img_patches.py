"""``ShuffleImgPatches``: Jigsaw's puzzle, patches reordered by one of a fixed set of
permutations, and the index of that permutation as the sample's label.

Noroozi & Favaro (ECCV 2016) choose a set of permutations of the 9 patches in advance,
far apart in Hamming distance (``extra_scripts/generate_jigsaw_permutations.py``), and
train the network to say which one was applied. With permutation ``p`` (a row of the
file) the output's patch ``k`` is the input's patch ``p[k]``.

``perm_file`` is a ``.npy`` file of shape ``(N, num_patches)``, each row a permutation of
``0 .. num_patches - 1`` (files numbered from 1, as Noroozi's, are shifted to 0, as VISSL
does). It is read when the transform is built: a local path (relative paths are looked
up in the working directory, then in the folder that holds vissl's ``configs``, so the
shipped files are found from anywhere), any iopath path, or an ``http(s)`` URL, which is
downloaded once into ``$TORCH_HOME/hub/vissl/jigsaw_permutations/``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

#: The folder holding ``configs/`` (the repository, or site-packages when installed).
_PACKAGE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def _is_url(path: str) -> bool:
    return path.startswith(("http://", "https://"))


def _cached_download(url: str) -> str:
    """The local copy of ``url`` under torch hub's folder, downloaded if missing."""
    folder = os.path.join(torch.hub.get_dir(), "vissl", "jigsaw_permutations")
    local = os.path.join(folder, os.path.basename(url.split("?")[0]) or "perms.npy")
    if not os.path.isfile(local):
        os.makedirs(folder, exist_ok=True)
        logger.info("ShuffleImgPatches: downloading %s to %s", url, local)
        torch.hub.download_url_to_file(url, local, progress=False)
    return local


def resolve_perm_file(path: Any, key: str) -> str:
    """A local file for ``perm_file`` (see the module docstring), or a ConfigError naming ``key``."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"{key} must name a .npy file of permutations (rows of patch indices), made "
            "by extra_scripts/generate_jigsaw_permutations.py or downloaded from VISSL; "
            f"got {path!r}.",
            key,
        )
    if _is_url(path):
        try:
            return _cached_download(path)
        except OSError as err:  # urllib's URLError and HTTPError are OSErrors
            raise ConfigError(f"{key}: cannot download {path}: {err}", key) from err
    candidates = [path]
    if not os.path.isabs(path):
        candidates.append(os.path.join(_PACKAGE_ROOT, path))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    if "://" in path:
        from iopath.common.file_io import g_pathmgr

        if g_pathmgr.exists(path):
            return str(g_pathmgr.get_local_path(path))
    raise ConfigError(
        f"{key}: permutation file {path!r} not found (looked in {candidates}). Make one "
        "with python extra_scripts/generate_jigsaw_permutations.py --N 100 --output_dir DIR.",
        key,
    )


def load_permutations(path: Any, key: str) -> np.ndarray:
    """The ``(N, M)`` int64 permutations of ``perm_file``, numbered from 0.

    Raises:
        ConfigError: naming ``key``: a missing or unreadable file, or rows that are not
            permutations of ``0 .. M - 1`` (or ``1 .. M``).
    """
    local = resolve_perm_file(path, key)
    try:
        perms = np.load(local, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{key}: cannot read {local} as a .npy array: {err}", key) from err
    if perms.ndim != 2 or perms.shape[0] < 1 or perms.shape[1] < 2:
        raise ConfigError(
            f"{key}: {local} holds an array of shape {perms.shape}; expected "
            "(number of permutations, number of patches).",
            key,
        )
    if not np.issubdtype(perms.dtype, np.integer):
        raise ConfigError(f"{key}: {local} holds {perms.dtype} values, not integers.", key)
    perms = perms.astype(np.int64)
    if perms.min() == 1:  # numbered from 1 (Noroozi's MATLAB files), as VISSL shifts them
        perms = perms - 1
    expected = np.arange(perms.shape[1])
    bad = [i for i, row in enumerate(perms) if not np.array_equal(np.sort(row), expected)]
    if bad:
        raise ConfigError(
            f"{key}: row {bad[0]} of {local} ({perms[bad[0]].tolist()}) is not a "
            f"permutation of 0..{perms.shape[1] - 1} ({len(bad)} such rows).",
            key,
        )
    return perms


@register_transform("ShuffleImgPatches")
class ShuffleImgPatches:
    """Reorder a list of patches by a random permutation of ``perm_file``; the label is
    the permutation's index.

    A "labels" transform: it returns ``(patches, label)`` where ``patches`` is one
    ``(num_patches, C, h, w)`` tensor and the sample's label entry becomes ``label`` (an
    int in ``0 .. N - 1``). The permutation is drawn with ``torch.randint`` from the
    sample's seeded generator, so a resumed run draws the same ones.

    Args:
        perm_file: the ``.npy`` file of permutations (see the module docstring).
    """

    ssl_transform_kind: ClassVar[str] = "labels"

    def __init__(self, perm_file: str, key_path: str = "ShuffleImgPatches") -> None:
        self.perm_file = perm_file
        self.key_path = key_path
        self.perms = load_permutations(perm_file, f"{key_path}.perm_file")
        logger.info(
            "ShuffleImgPatches: %d permutations of %d patches from %s",
            self.num_perms,
            self.num_patches,
            perm_file,
        )

    @property
    def num_perms(self) -> int:
        """How many permutations (the number of classes of the Jigsaw head)."""
        return int(self.perms.shape[0])

    @property
    def num_patches(self) -> int:
        return int(self.perms.shape[1])

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> ShuffleImgPatches:
        unknown = sorted(set(kwargs) - {"perm_file"})
        if unknown:
            raise ConfigError(
                f"{key_path}: ShuffleImgPatches has no argument(s) {unknown}; it takes perm_file.",
                f"{key_path}.{unknown[0]}",
            )
        if "perm_file" not in kwargs:
            raise ConfigError(
                f"{key_path}.perm_file is missing: ShuffleImgPatches needs the .npy file of "
                "permutations (extra_scripts/generate_jigsaw_permutations.py makes one).",
                f"{key_path}.perm_file",
            )
        return cls(kwargs["perm_file"], key_path=key_path)

    def shuffle(self, patches: Sequence[Any] | torch.Tensor, index: int) -> torch.Tensor:
        """``patches`` reordered by permutation ``index``, stacked into one tensor.

        Raises:
            ConfigError: the number of patches is not the permutations' length.
        """
        if len(patches) != self.num_patches:
            raise ConfigError(
                f"{self.key_path}.perm_file holds permutations of {self.num_patches} patches "
                f"but the sample has {len(patches)}: num_patches of ImgPatchesFromTensor "
                "must match the permutation file.",
                f"{self.key_path}.perm_file",
            )
        return torch.stack([torch.as_tensor(patches[int(i)]) for i in self.perms[index]])

    def __call__(self, patches: Sequence[Any] | torch.Tensor) -> tuple[torch.Tensor, int]:
        index = int(torch.randint(self.num_perms, (1,)).item())
        return self.shuffle(patches, index), index

    def __repr__(self) -> str:
        return f"ShuffleImgPatches(perm_file={self.perm_file!r}, num_perms={self.num_perms})"
