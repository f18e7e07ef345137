"""``GenericSSLDataset``: VISSL's dataset over one or more data sources of a split."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from vissl.config.attr_dict import AttrDict
from vissl.config.validation import ignored_path_error
from vissl.data.data_helper import (
    balanced_sub_sampling,
    load_array_file,
    split_cfg_value,
    unbalanced_sub_sampling,
)
from vissl.data.data_sources import get_data_source
from vissl.data.dataset_catalog import default_catalog_path, get_data_files
from vissl.data.device_decode import (
    DecodeTail,
    ViewPlan,
    check_decode_sources,
    pack_views,
    plan_decode_head,
)
from vissl.data.samplers import (
    PADDING_DATA_VALID,
    SampleKey,
    SeededSamples,
    batch_seed,
    sample_seed,
)
from vissl.data.ssl_transforms import build_transforms
from vissl.data.ssl_transforms.device_path import SUPPORTED_COLLATORS, plan_device_path
from vissl.data.ssl_transforms.seeding import seeded_rng  # re-exported: its old home
from vissl.errors import ConfigError
from vissl.utils.distributed import get_world_size

logger = logging.getLogger(__name__)

LABEL_TYPES = ("standard", "sample_index", "zero")
#: Label used by ``LABEL_TYPE: standard`` for a source that has no labels of its own.
NO_LABEL = -1


def _as_list(value: Any, key_path: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{key_path} must be a list, got {value!r}.", key_path)
    return list(value)


def _to_label(value: Any) -> Any:
    """Plain Python ints for integer labels (int32 would not index), else unchanged."""
    if isinstance(value, np.ndarray):
        return value.astype(np.int64) if value.dtype.kind in "iu" else value
    if isinstance(value, np.integer):
        return int(value)
    return value


def _numeric_labels(labels: np.ndarray) -> np.ndarray:
    """String labels become indices into their sorted unique values (as in VISSL)."""
    if labels.dtype.kind in "US" or (labels.dtype == object and isinstance(labels[0], str)):
        names = sorted({str(x) for x in labels})
        lookup = {name: i for i, name in enumerate(names)}
        return np.asarray([lookup[str(x)] for x in labels], dtype=np.int64)
    if labels.dtype.kind in "iu":
        return np.asarray(labels, dtype=np.int64)
    return labels


class GenericSSLDataset(Dataset[dict[str, Any]]):
    """VISSL's dataset: one sample per index, one entry per data source.

    ``dataset[idx]`` returns, after ``DATA.<split>.TRANSFORMS``::

        {"data": [image per source], "label": [label per source or label source],
         "data_valid": [1, -1 for an unreadable image, 0 for the sampler's padding],
         "data_idx": [idx, ...]}

    Labels: with ``LABEL_SOURCES`` set, one label per label source (``disk_filelist``
    reads the ``.npy`` in ``LABEL_PATHS``; a data source name such as ``disk_folder``
    uses that source's own labels). Otherwise ``LABEL_TYPE`` decides: ``standard``
    gives each source's own labels (-1 for a source without labels),
    ``sample_index`` the index ``idx`` and ``zero`` 0.

    Paths: ``DATA_PATHS`` has one entry per source. When it is empty, each source that
    needs a path takes it from the dataset catalog entry of its ``DATASET_NAMES`` name
    (see :mod:`vissl.data.dataset_catalog`), for TRAIN the entry's ``train`` split, for
    TEST ``val`` (or ``test``); an empty ``LABEL_PATHS`` likewise takes the catalog's label
    file for a ``disk_filelist`` label source.

    ``DATA_LIMIT`` > 0 keeps a deterministic random subset (``DATA_LIMIT_SAMPLING``:
    ``SEED``, ``IS_BALANCED`` over the first source's labels, ``SKIP_NUM_SAMPLES``).

    Transforms: ``TRANSFORMS`` built by :func:`~vissl.data.ssl_transforms.build_transforms`;
    the run of transforms before ``ToTensor`` runs on tensors unless
    ``FAST_TRANSFORMS`` is False (see :mod:`vissl.data.ssl_transforms.tensor_path`).
    When that run starts with the first transform, a source with a
    ``get_image_tensor(idx) -> (uint8 (C, H, W) tensor, is_valid)`` method (the disk
    sources, ``synthetic``) is asked for a tensor instead of a PIL image.

    On the device: :meth:`move_transforms_to_device` (``TRANSFORMS_ON_DEVICE``) cuts the
    chain after its last crop or flip; with ``DECODE_ON_DEVICE`` the disk sources' files
    are not decoded here either: the samples' views are plans packed into ``uint8`` rows
    per batch by :meth:`__getitems__` (see :mod:`vissl.data.device_decode`).

    Args:
        cfg: the full config (``cfg.DATA.<split>``).
        split: ``"TRAIN"`` or ``"TEST"``.

    Raises:
        ConfigError: invalid data settings; the message names the key path.
    """

    def __init__(self, cfg: AttrDict, split: str) -> None:
        self.seed = int(cfg.get("SEED_VALUE", 0))
        super().__init__()
        if "DATA" not in cfg or split not in cfg["DATA"]:
            raise ConfigError(
                f"config.DATA.{split} does not exist; splits are TRAIN and TEST.",
                f"config.DATA.{split}",
            )
        self.cfg = cfg
        self.split = split
        self.split_cfg = cfg["DATA"][split]
        self._key = f"config.DATA.{split}"
        sc = self.split_cfg
        self.batchsize_per_replica = int(split_cfg_value(sc, "BATCHSIZE_PER_REPLICA", 1))
        self.data_sources: list[str] = self._str_list("DATA_SOURCES")
        self.data_paths: list[Any] = _as_list(
            split_cfg_value(sc, "DATA_PATHS", []), self._path("DATA_PATHS")
        )
        self.dataset_names: list[str] = self._str_list("DATASET_NAMES")
        self.label_sources: list[str] = self._str_list("LABEL_SOURCES")
        self.label_paths: list[Any] = _as_list(
            split_cfg_value(sc, "LABEL_PATHS", []), self._path("LABEL_PATHS")
        )
        self.label_type: str = split_cfg_value(sc, "LABEL_TYPE", "standard")
        self.data_limit = int(split_cfg_value(sc, "DATA_LIMIT", -1))
        self.data_limit_sampling = split_cfg_value(sc, "DATA_LIMIT_SAMPLING", {}) or {}
        #: Whether DATA_PATHS (and LABEL_PATHS) were read from the dataset catalog.
        self.paths_from_catalog = False
        #: DECODE_ON_DEVICE asked for (it takes effect in move_transforms_to_device)
        self.decode_on_device = bool(split_cfg_value(sc, "DECODE_ON_DEVICE", False))
        #: whether the samples are planned views packed into rows (DECODE_ON_DEVICE)
        self._decoding = False
        self._verify()
        self._warn_unsupported()
        self.transform = build_transforms(
            split_cfg_value(sc, "TRANSFORMS", []),
            split,
            tensor_path=bool(split_cfg_value(sc, "FAST_TRANSFORMS", True)),
        )

        self.data_objs = [
            self._build_source(i, source) for i, source in enumerate(self.data_sources)
        ]
        sizes = [len(obj) for obj in self.data_objs]
        if len(set(sizes)) > 1:
            raise ConfigError(
                f"{self._path('DATA_SOURCES')}: the data sources {self.data_sources} have "
                f"different sizes {sizes}; several sources are read index by index, so "
                "they must be aligned.",
                self._path("DATA_SOURCES"),
            )
        self.label_objs: list[Any] = self._load_labels()
        self._own_labels: list[np.ndarray | None] = (
            [obj.get_labels() for obj in self.data_objs]
            if not self.label_objs and self.label_type == "standard"
            else []
        )
        self.sub_set: np.ndarray | None = self._init_subset()
        logger.info(
            "%s: %d samples from %s (label type %s)",
            self._key,
            len(self),
            self.data_sources,
            "label sources" if self.label_objs else self.label_type,
        )

    # ------------------------------------------------------------------ validation
    def _path(self, key: str) -> str:
        return f"{self._key}.{key}"

    def _str_list(self, key: str) -> list[str]:
        values = _as_list(split_cfg_value(self.split_cfg, key, []), self._path(key))
        for value in values:
            if not isinstance(value, str):
                raise ConfigError(
                    f"{self._path(key)} must be a list of strings, got {values!r}.",
                    self._path(key),
                )
        return values

    def _verify(self) -> None:
        n = len(self.data_sources)
        if n == 0:
            raise ConfigError(
                f"{self._path('DATA_SOURCES')} is empty: list at least one data source, "
                "e.g. [disk_folder] with DATA_PATHS [/path/to/images], or [digits].",
                self._path("DATA_SOURCES"),
            )
        classes = [get_data_source(s) for s in self.data_sources]  # unknown -> error
        if self.data_paths and len(self.data_paths) != n:
            raise ConfigError(
                f"{self._path('DATA_PATHS')} has {len(self.data_paths)} entries but "
                f"DATA_SOURCES has {n} ({self.data_sources}); give one path per source.",
                self._path("DATA_PATHS"),
            )
        names_given = bool(self.dataset_names)
        if not self.dataset_names:
            self.dataset_names = list(self.data_sources)
        elif len(self.dataset_names) != n:
            raise ConfigError(
                f"{self._path('DATASET_NAMES')} has {len(self.dataset_names)} entries but "
                f"DATA_SOURCES has {n}; give one name per source or none.",
                self._path("DATASET_NAMES"),
            )
        needs_path = [bool(getattr(cls, "requires_path", True)) for cls in classes]
        for i, (needed, path) in enumerate(zip(needs_path, self.data_paths, strict=False)):
            if path and not needed:
                raise ignored_path_error(self.split, i, self.data_sources[i], path)
        if not self.data_paths and any(needs_path):
            needy = [s for s, needed in zip(self.data_sources, needs_path) if needed]
            if not names_given:
                raise ConfigError(
                    f"{self._path('DATA_PATHS')} is empty but the data sources {needy} need "
                    f"a path each: give DATA_PATHS (one per source), or name datasets of the "
                    f"dataset catalog ({default_catalog_path() or 'no catalog file'}) in "
                    f"{self._path('DATASET_NAMES')}.",
                    self._path("DATA_PATHS"),
                )
            self._paths_from_catalog(needs_path)
        if self.label_type not in LABEL_TYPES:
            raise ConfigError(
                f"{self._path('LABEL_TYPE')}={self.label_type!r} is unknown; use one of "
                f"{list(LABEL_TYPES)}.",
                self._path("LABEL_TYPE"),
            )
        if self.label_paths and len(self.label_paths) != len(self.label_sources):
            raise ConfigError(
                f"{self._path('LABEL_PATHS')} has {len(self.label_paths)} entries but "
                f"LABEL_SOURCES has {len(self.label_sources)}; give one per label source.",
                self._path("LABEL_PATHS"),
            )
        on_device = bool(split_cfg_value(self.split_cfg, "TRANSFORMS_ON_DEVICE", False))
        if self.decode_on_device and not on_device:
            key = self._path("DECODE_ON_DEVICE")
            raise ConfigError(
                f"{key}=True decodes the JPEGs on the device and then runs the colour "
                f"transforms there, which is {self._path('TRANSFORMS_ON_DEVICE')}=True: set "
                f"that as well, or set {key}=False.",
                key,
            )
        if self.data_limit == 0 or self.data_limit < -1:
            raise ConfigError(
                f"{self._path('DATA_LIMIT')}={self.data_limit}: use -1 for all samples or "
                "a positive number.",
                self._path("DATA_LIMIT"),
            )

    def _paths_from_catalog(self, needs_path: list[bool]) -> None:
        """DATA_PATHS (and disk_filelist LABEL_PATHS, when empty) from the dataset catalog."""
        label_sources = () if self.label_paths else tuple(self.label_sources)
        data_paths, label_paths = get_data_files(
            self.split, self.dataset_names, needs_path, label_sources
        )
        self.data_paths = data_paths
        if not self.label_paths and "disk_filelist" in self.label_sources:
            self.label_paths = label_paths
        self.paths_from_catalog = True
        logger.info(
            "%s: paths of %s from the dataset catalog: %s%s",
            self._key,
            self.dataset_names,
            self.data_paths,
            f", labels {self.label_paths}" if self.label_paths else "",
        )

    def _build_source(self, i: int, source: str) -> Any:
        try:
            return get_data_source(source)(
                cfg=self.cfg,
                path=self.data_paths[i] if self.data_paths else "",
                split=self.split,
                dataset_name=self.dataset_names[i],
                data_source=source,
            )
        except ConfigError as err:
            if not self.paths_from_catalog or not self.data_paths[i]:
                raise
            raise ConfigError(
                f"{err} (The path {self.data_paths[i]!r} comes from the dataset catalog "
                f"entry {self._path('DATASET_NAMES')}[{i}]={self.dataset_names[i]!r}: fix "
                "that entry, or give DATA_PATHS.)",
                err.key_path,
            ) from err

    def move_transforms_to_device(self) -> Any:
        """Split the chain for ``TRANSFORMS_ON_DEVICE``: from now on this dataset stops
        after the last crop/flip and gives ``uint8`` crops; the returned
        :class:`~vissl.data.ssl_transforms.device_path.DeviceTail` does the rest on a
        batch (the train step calls it on the device).

        With ``DECODE_ON_DEVICE`` the workers only read the files and plan the crops and
        flips, and the returned :class:`~vissl.data.device_decode.DecodeTail` decodes,
        crops and flips on the device before the colour transforms.

        Raises:
            ConfigError: the chain cannot be split (see ``plan_device_path``), or cannot be
                planned without pixels, or the data are not JPEG files on disk
                (``DECODE_ON_DEVICE``).
        """
        key = self._path("TRANSFORMS_ON_DEVICE")
        collator = split_cfg_value(self.split_cfg, "COLLATE_FUNCTION", "default_collate")
        input_keys = list(split_cfg_value(self.split_cfg, "INPUT_KEY_NAMES", ["data"]))
        if collator not in SUPPORTED_COLLATORS or input_keys != ["data"]:
            raise ConfigError(
                f"{key}=True runs the colour transforms on batches laid out by "
                f"{' / '.join(SUPPORTED_COLLATORS)} with INPUT_KEY_NAMES [data]; this config "
                f"has COLLATE_FUNCTION {collator!r} and INPUT_KEY_NAMES {input_keys}. Set "
                f"{key}=False for it.",
                key,
            )
        if len(self.data_objs) != 1:
            raise ConfigError(
                f"{key}=True supports one data source; {self._path('DATA_SOURCES')} lists "
                f"{len(self.data_objs)}. Set {key}=False for it.",
                key,
            )
        # the views per sample, counted on this data set's first image through the
        # workers' part of the chain (the global RNG states are restored afterwards)
        full = self.transform
        head, tail = plan_device_path(full, self.seed, key, count_views=self._count_views)
        self.transform = head
        if self.decode_on_device:
            return self._move_decoding_to_device(tail)
        logger.info("%s: on the device: %s", key, tail)
        return tail

    def _move_decoding_to_device(self, colour: Any) -> DecodeTail:
        """``DECODE_ON_DEVICE``: the workers only read the files and plan the crops and
        flips (:mod:`vissl.data.device_decode`); the tail decodes, crops, then colours."""
        key = self._path("DECODE_ON_DEVICE")
        check_decode_sources(self.data_objs, self.data_sources, key)
        head = plan_decode_head(self.transform, key)
        saved, self.transform = self.transform, head
        self._decoding = True
        try:  # one sample through the planned chain: its views are those the tail expects
            with seeded_rng(0):
                views = self._get_sample(0)["data"]
        except BaseException:
            self.transform, self._decoding = saved, False
            raise
        if len(views) != colour.num_views or not all(isinstance(v, ViewPlan) for v in views):
            self.transform, self._decoding = saved, False
            raise ConfigError(
                f"{key}: the planned chain makes {len(views)} views per sample where the "
                f"chain makes {colour.num_views}; set {key}=False for this chain.",
                key,
            )
        tail = DecodeTail(colour, key)
        logger.info("%s: on the device: %s", key, tail)
        return tail

    def _count_views(self, head: Any) -> int:
        saved, self.transform = self.transform, head
        try:
            with seeded_rng(0):
                return len(self._get_sample(0)["data"])
        finally:
            self.transform = saved

    def _warn_unsupported(self) -> None:
        for key in ("ENABLE_QUEUE_DATASET", "COPY_TO_LOCAL_DISK"):
            if split_cfg_value(self.split_cfg, key, False):
                logger.warning("%s is not supported by vissl yet; ignoring it.", self._path(key))

    # ------------------------------------------------------------------ labels
    def _load_labels(self) -> list[Any]:
        labels: list[Any] = []
        mmap = bool(split_cfg_value(self.split_cfg, "MMAP_MODE", True))
        size = len(self.data_objs[0])
        key = self._path("LABEL_SOURCES")
        for i, source in enumerate(self.label_sources):
            if source == "disk_filelist":
                path_key = f"{self._path('LABEL_PATHS')}[{i}]"
                if i >= len(self.label_paths):
                    raise ConfigError(
                        f"{path_key} is missing: label source disk_filelist needs the "
                        "path of a .npy file of labels.",
                        self._path("LABEL_PATHS"),
                    )
                paths = self.label_paths[i]
                if isinstance(paths, list):  # several label files: a list of labels
                    loaded: Any = [load_array_file(p, mmap=mmap, key_path=path_key) for p in paths]
                    lengths = [len(a) for a in loaded]
                else:
                    loaded = _numeric_labels(load_array_file(paths, mmap=mmap, key_path=path_key))
                    lengths = [len(loaded)]
                if any(n != size for n in lengths):
                    raise ConfigError(
                        f"{path_key}: {paths!r} has {lengths} labels but the data has "
                        f"{size} samples.",
                        self._path("LABEL_PATHS"),
                    )
                labels.append(loaded)
                continue
            if i >= len(self.data_sources) or self.data_sources[i] != source:
                raise ConfigError(
                    f"{key}[{i}]={source!r}: a label source is 'disk_filelist' (with a "
                    "LABEL_PATHS entry) or the name of the data source at the same index "
                    f"(DATA_SOURCES={self.data_sources}), whose own labels are used.",
                    key,
                )
            own = self.data_objs[i].get_labels()
            if own is None:
                raise ConfigError(
                    f"{key}[{i}]={source!r}: data source {source!r} has no labels of its "
                    "own; use disk_filelist with a .npy in LABEL_PATHS.",
                    key,
                )
            labels.append(np.asarray(own, dtype=np.int64))
        return labels

    # ------------------------------------------------------------------ subset
    def _init_subset(self) -> np.ndarray | None:
        if self.data_limit < 0:
            return None
        sampling = self.data_limit_sampling
        seed = int(split_cfg_value(sampling, "SEED", 0))
        skip = int(split_cfg_value(sampling, "SKIP_NUM_SAMPLES", 0))
        balanced = bool(split_cfg_value(sampling, "IS_BALANCED", False))
        total = len(self.data_objs[0])
        key = self._path("DATA_LIMIT")
        if skip < 0:
            raise ConfigError(
                f"{key}_SAMPLING.SKIP_NUM_SAMPLES={skip} must be >= 0.",
                f"{key}_SAMPLING.SKIP_NUM_SAMPLES",
            )
        if skip + self.data_limit > total:
            raise ConfigError(
                f"{key}={self.data_limit} (+ SKIP_NUM_SAMPLES={skip}) is more than the "
                f"{total} samples of {self.data_sources}.",
                key,
            )
        if not balanced:
            return unbalanced_sub_sampling(total, self.data_limit, skip, seed)
        labels = self.label_objs[0] if self.label_objs else self.data_objs[0].get_labels()
        if labels is None or isinstance(labels, list):
            raise ConfigError(
                f"{key}_SAMPLING.IS_BALANCED needs single labels for the first data source; "
                f"{self.data_sources[0]!r} has none. Set LABEL_SOURCES or IS_BALANCED: False.",
                f"{key}_SAMPLING.IS_BALANCED",
            )
        try:
            return balanced_sub_sampling(labels, self.data_limit, skip, seed)
        except ValueError as err:
            raise ConfigError(f"{key}_SAMPLING.IS_BALANCED: {err}.", key) from err

    # ------------------------------------------------------------------ access
    def _label_for(self, idx: int, subset_idx: int) -> list[Any]:
        if self.label_objs:
            out = []
            for labels in self.label_objs:
                if isinstance(labels, list):
                    out.append([_to_label(entry[subset_idx]) for entry in labels])
                else:
                    out.append(_to_label(labels[subset_idx]))
            return out
        n = len(self.data_objs)
        if self.label_type == "sample_index":
            return [idx] * n
        if self.label_type == "zero":
            return [0] * n
        return [NO_LABEL if own is None else _to_label(own[subset_idx]) for own in self._own_labels]

    def __getitem__(self, key: int | SampleKey) -> dict[str, Any]:
        """The transformed sample dict of index ``key`` (see :meth:`_fetch`); with
        ``DECODE_ON_DEVICE`` its views packed alone (see :meth:`__getitems__`)."""
        sample = self._fetch(key)
        return pack_views([sample])[0] if self._decoding else sample

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> list[dict[str, Any]]:
        """The samples of a batch (the ``DataLoader`` fetches a batch with this); for the
        sampler's keys, a :class:`~vissl.data.samplers.SeededSamples` list that carries the
        batch's seed for collators that draw at random.

        With ``DECODE_ON_DEVICE`` the batch's planned views are packed together into
        ``uint8`` rows, the batch's files spread over them
        (:func:`~vissl.data.device_decode.pack_views`): collate the result of one call.
        """
        if not self._decoding:  # what the DataLoader does without this method
            samples = [self[key] for key in keys]
            # a collator that draws at random per batch (cutmixup) seeds from this
            seed = batch_seed(self.seed, keys)
            return samples if seed is None else SeededSamples(samples, seed)
        return pack_views([self._fetch(key) for key in keys])

    def _fetch(self, key: int | SampleKey) -> dict[str, Any]:
        """The transformed sample dict of index ``key`` (see the class docstring).

        ``key`` is an index, or a :class:`~vissl.data.samplers.SampleKey` ``(index, epoch)``
        from the stateful sampler: then the augmentations are drawn from a generator seeded
        by ``(SEED_VALUE, epoch, index)``, so they do not depend on the worker, the number
        of workers or the process, and a resumed run repeats them exactly. The global RNG
        state of the calling process is left untouched. A key marked as padding gives
        ``data_valid`` 0 (the sample repeats one that another rank or batch already has).
        """
        if isinstance(key, tuple):
            idx, epoch = int(key[0]), int(key[1])
            padding = len(key) > 2 and bool(key[2])
            with seeded_rng(sample_seed(self.seed, epoch, idx)):
                return self._get_sample(idx, padding)
        return self._get_sample(int(key))

    def _get_sample(self, idx: int, padding: bool = False) -> dict[str, Any]:
        if not 0 <= idx < len(self):
            raise IndexError(f"index {idx} out of range for a dataset of {len(self)} samples")
        subset_idx = int(self.sub_set[idx]) if self.sub_set is not None else idx
        item: dict[str, Any] = {"data": [], "data_valid": [], "data_idx": []}
        tensors = getattr(self.transform, "takes_image_tensors", False)
        for source in self.data_objs:
            reader = getattr(source, "get_image_tensor", None) if tensors else None
            if self._decoding:  # DECODE_ON_DEVICE: the file, undecoded
                reader = source.get_encoded_image
            data, valid = reader(subset_idx) if reader is not None else source[subset_idx]
            item["data"].append(data)
            item["data_valid"].append(PADDING_DATA_VALID if padding else 1 if valid else -1)
            item["data_idx"].append(idx)
        item["label"] = self._label_for(idx, subset_idx)
        return self.transform(item)

    def __len__(self) -> int:
        return self.num_samples()

    def num_samples(self, source_idx: int = 0) -> int:
        """Number of samples (after ``DATA_LIMIT``)."""
        if self.sub_set is not None:
            return len(self.sub_set)
        return len(self.data_objs[source_idx])

    def get_labels(self, source_idx: int = 0) -> np.ndarray | None:
        """Labels of all samples of this dataset, in index order, or None.

        Uses the first label source (or the source's own labels under ``standard``).
        """
        if self.label_objs:
            labels = self.label_objs[source_idx]
            if isinstance(labels, list):
                return None
        elif self.label_type == "sample_index":
            return np.arange(len(self), dtype=np.int64)
        elif self.label_type == "zero":
            return np.zeros(len(self), dtype=np.int64)
        else:
            labels = self._own_labels[source_idx]
            if labels is None:
                return None
        labels = np.asarray(labels)
        return labels[self.sub_set] if self.sub_set is not None else labels.copy()

    def get_image_paths(self) -> list[list[str]]:
        """Image paths of every data source (empty lists for in-memory sources)."""
        return [obj.get_image_paths() for obj in self.data_objs]

    def get_batchsize_per_replica(self) -> int:
        """``BATCHSIZE_PER_REPLICA`` of this split."""
        return self.batchsize_per_replica

    def get_global_batchsize(self) -> int:
        """The batch size summed over all replicas."""
        return self.batchsize_per_replica * get_world_size()

    def __repr__(self) -> str:
        return (
            f"GenericSSLDataset(split={self.split!r}, sources={self.data_sources}, "
            f"size={len(self)}, transform={self.transform!r})"
        )
