"""The dataset catalog: names in ``DATA.<split>.DATASET_NAMES`` -> paths on disk (VISSL's).

A catalog entry maps a name to its splits, each ``[data_path, label_path]``::

    {"imagenet1k_folder": {"train": ["/data/imagenet/train", "<unused>"],
                           "val": ["/data/imagenet/val", "<unused>"]}}

The TRAIN split reads ``train``; TEST reads ``val`` (or ``test`` when there is no ``val``).
The default catalog is ``configs/config/dataset_catalog.json``, or the file named by the
environment variable ``VISSL_DATASET_CATALOG_PATH``; it is read on first use. More entries
can be registered from Python with :meth:`VisslDatasetCatalog.register_json` /
:meth:`~VisslDatasetCatalog.register_dict`.

The catalog is used for the data sources that need a path when ``DATA_PATHS`` is empty
(and for ``disk_filelist`` labels when ``LABEL_PATHS`` is empty).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from iopath.common.file_io import g_pathmgr

from vissl.errors import ConfigError, DuplicateNameError, UnknownNameError

logger = logging.getLogger(__name__)

#: Environment variable naming another catalog file (VISSL's).
CATALOG_ENV = "VISSL_DATASET_CATALOG_PATH"
_CATALOG_NAME = os.path.join("configs", "config", "dataset_catalog.json")
#: Catalog split names read for each vissl split, in order of preference.
SPLIT_KEYS: dict[str, tuple[str, ...]] = {"TRAIN": ("train",), "TEST": ("val", "test")}


def default_catalog_path() -> str | None:
    """The catalog file: $VISSL_DATASET_CATALOG_PATH, else the repository's, else None."""
    env = os.environ.get(CATALOG_ENV, "")
    if env:
        return env
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidate = os.path.join(repo, _CATALOG_NAME)
    return candidate if os.path.isfile(candidate) else None


class VisslDatasetCatalog:
    """Registry of datasets: name -> ``{"train": [data, label], "val": [data, label]}``.

    All methods are static and share one catalog per process, as in VISSL. The default
    catalog file is loaded on first use.
    """

    _datasets: ClassVar[dict[str, dict[str, Any]]] = {}
    _defaults_loaded: ClassVar[bool] = False

    @classmethod
    def _ensure_defaults(cls) -> None:
        if cls._defaults_loaded:
            return
        cls._defaults_loaded = True
        path = default_catalog_path()
        if not path:
            return
        if os.environ.get(CATALOG_ENV, "") and not g_pathmgr.exists(path):
            cls._defaults_loaded = False
            raise ConfigError(
                f"${CATALOG_ENV}={path!r} names a dataset catalog file that does not exist. "
                "Point it at a JSON catalog, or unset it to use the default "
                f"{_CATALOG_NAME}.",
                "config.DATA.<split>.DATASET_NAMES",
            )
        try:
            cls.register_json(path)
        except Exception:
            cls._defaults_loaded = False
            cls._datasets.clear()
            raise

    @staticmethod
    def register_json(json_catalog_path: str) -> None:
        """Register every entry of a JSON catalog file.

        Raises:
            ConfigError: the file is missing or not a JSON object of entries.
            DuplicateNameError: an entry name is already registered.
        """
        VisslDatasetCatalog._ensure_defaults()
        try:
            with g_pathmgr.open(json_catalog_path, "r") as f:
                catalog = json.load(f)
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"dataset catalog {json_catalog_path!r} cannot be read: {err}",
                "config.DATA.<split>.DATASET_NAMES",
            ) from err
        if not isinstance(catalog, dict):
            raise ConfigError(
                f"dataset catalog {json_catalog_path!r} must hold a JSON object "
                '{"name": {"train": [data_path, label_path], "val": [...]}, ...}.',
                "config.DATA.<split>.DATASET_NAMES",
            )
        logger.debug("registering %d datasets from %s", len(catalog), json_catalog_path)
        VisslDatasetCatalog.register_dict(catalog)

    @staticmethod
    def register_dict(dict_catalog: Mapping[str, Any]) -> None:
        """Register every ``name: {split: [data_path, label_path]}`` of ``dict_catalog``."""
        for name, data in dict_catalog.items():
            VisslDatasetCatalog.register_data(name, data)

    @staticmethod
    def register_data(name: str, data_dict: Mapping[str, Any]) -> None:
        """Register one dataset.

        Raises:
            ConfigError: ``data_dict`` is not ``{split: [data_path, label_path]}``.
            DuplicateNameError: ``name`` is already registered.
        """
        VisslDatasetCatalog._ensure_defaults()
        if not isinstance(data_dict, Mapping) or not all(
            isinstance(v, list | tuple) and len(v) >= 1 for v in data_dict.values()
        ):
            raise ConfigError(
                f"dataset catalog entry {name!r} must be a dict of splits, each "
                f'[data_path, label_path], e.g. {{"train": ["/data/x/train", ""]}}; '
                f"got {data_dict!r}.",
                "config.DATA.<split>.DATASET_NAMES",
            )
        if name in VisslDatasetCatalog._datasets:
            raise DuplicateNameError(
                f"dataset {name!r} is already registered in the dataset catalog; remove it "
                "first (VisslDatasetCatalog.remove) or use another name."
            )
        VisslDatasetCatalog._datasets[name] = {k: list(v) for k, v in data_dict.items()}

    @staticmethod
    def get(name: str) -> dict[str, Any]:
        """The entry of ``name``.

        Raises:
            UnknownNameError: ``name`` is not registered (the message lists the names).
        """
        VisslDatasetCatalog._ensure_defaults()
        try:
            return VisslDatasetCatalog._datasets[name]
        except KeyError:
            raise UnknownNameError(
                f"Dataset {name!r} is not registered in the dataset catalog "
                f"({default_catalog_path() or 'no catalog file'}). Available datasets: "
                f"{', '.join(sorted(VisslDatasetCatalog._datasets)) or 'none'}."
            ) from None

    @staticmethod
    def list() -> list[str]:
        """The registered dataset names."""
        VisslDatasetCatalog._ensure_defaults()
        return list(VisslDatasetCatalog._datasets)

    @staticmethod
    def has_data(name: str) -> bool:
        """Whether ``name`` is registered."""
        VisslDatasetCatalog._ensure_defaults()
        return name in VisslDatasetCatalog._datasets

    @staticmethod
    def remove(name: str) -> None:
        """Unregister ``name`` (UnknownNameError if it is not registered)."""
        VisslDatasetCatalog.get(name)
        VisslDatasetCatalog._datasets.pop(name)

    @staticmethod
    def clear() -> None:
        """Unregister every dataset (the default catalog is not read again)."""
        VisslDatasetCatalog._defaults_loaded = True
        VisslDatasetCatalog._datasets.clear()


def _catalog_split(name: str, split: str, key: str, index: int) -> list[Any]:
    """The ``[data_path, label_path]`` of ``name`` for ``split``; ``key`` is DATASET_NAMES."""
    if not VisslDatasetCatalog.has_data(name):
        known = ", ".join(sorted(VisslDatasetCatalog.list())) or "none"
        raise ConfigError(
            f"{key}[{index}]={name!r} is not registered in the dataset catalog "
            f"({default_catalog_path() or 'no catalog file'}). Registered datasets: {known}. "
            f"Add an entry to the catalog file (or point ${CATALOG_ENV} at your own), "
            "register it with VisslDatasetCatalog.register_dict, or give "
            f"config.DATA.{split}.DATA_PATHS.",
            key,
        )
    entry = VisslDatasetCatalog.get(name)
    split_keys = SPLIT_KEYS.get(split, (split.lower(),))
    for split_key in split_keys:
        if split_key in entry:
            return list(entry[split_key])
    raise ConfigError(
        f"{key}[{index}]={name!r}: its dataset catalog entry has no "
        f"{' or '.join(repr(k) for k in split_keys)} split for {split} (it has "
        f"{sorted(entry)}). Add the split to the entry or give "
        f"config.DATA.{split}.DATA_PATHS.",
        key,
    )


def get_data_files(
    split: str,
    dataset_names: Sequence[str],
    needs_path: Sequence[bool],
    label_sources: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """Paths of ``split`` for each dataset name, from the catalog.

    Args:
        split: ``"TRAIN"`` or ``"TEST"``.
        dataset_names: ``DATA.<split>.DATASET_NAMES``, one per data source.
        needs_path: per data source, whether it reads a path (``digits``/``synthetic`` do not:
            their entry is "" and their name need not be in the catalog).
        label_sources: ``DATA.<split>.LABEL_SOURCES``; a ``disk_filelist`` label source at
            index i reads the label path of dataset i.

    Returns:
        (data_paths, label_paths): one data path per data source; one label path per label
        source ("" for label sources that use a data source's own labels).

    Raises:
        ConfigError: an unknown name (listing the catalog's names), a missing split, or a
            catalog path that does not exist; the key path is ``DATASET_NAMES``.
    """
    key = f"config.DATA.{split}.DATASET_NAMES"
    data_paths: list[str] = []
    for i, (name, needed) in enumerate(zip(dataset_names, needs_path)):
        if not needed:
            data_paths.append("")
            continue
        item = _catalog_split(name, split, key, i)
        path = item[0]
        if isinstance(path, str) and not g_pathmgr.exists(path):
            raise ConfigError(
                f"{key}[{i}]={name!r}: the dataset catalog ({default_catalog_path()}) points "
                f"{split} at {path!r}, which does not exist. Edit the catalog (or point "
                f"${CATALOG_ENV} at yours), or give config.DATA.{split}.DATA_PATHS.",
                key,
            )
        data_paths.append(path)
    label_paths: list[str] = []
    for i, source in enumerate(label_sources):
        if source != "disk_filelist":
            label_paths.append("")
            continue
        if i >= len(dataset_names):
            raise ConfigError(
                f"config.DATA.{split}.LABEL_SOURCES[{i}]=disk_filelist has no dataset name "
                f"at {key}[{i}] to read its labels from the catalog; give LABEL_PATHS.",
                f"config.DATA.{split}.LABEL_PATHS",
            )
        item = _catalog_split(dataset_names[i], split, key, i)
        label = item[1] if len(item) > 1 else ""
        if not label or not g_pathmgr.exists(label):
            raise ConfigError(
                f"{key}[{i}]={dataset_names[i]!r}: the dataset catalog has no existing label "
                f"file for {split} (got {label!r}) but LABEL_SOURCES[{i}] is disk_filelist. "
                f"Fix the catalog entry or give config.DATA.{split}.LABEL_PATHS.",
                f"config.DATA.{split}.LABEL_PATHS",
            )
        label_paths.append(label)
    return data_paths, label_paths
