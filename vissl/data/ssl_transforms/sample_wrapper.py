"""Applying transforms to VISSL's sample dict: the ``indices`` rule and list expansion.

A sample is ``{"data": [...], "label": [...], "data_valid": [...], "data_idx": [...]}``
with one entry per data source. ``SSLTransformsWrapper`` applies one transform to the
entries listed in ``indices`` (every entry when ``indices`` is empty or missing). How
the output is stored depends on the transform's kind:

- ``"image"`` (default): the output replaces the entry.
- ``"copies"`` (``ImgReplicatePil``, ``ImgPilToMultiCrop``, ...): the output is a list;
  ``data`` is flattened so later transforms see every copy, and ``label``,
  ``data_valid`` and ``data_idx`` are repeated to stay aligned with ``data``.
- ``"labels"``: the output is ``(image, label)``; the label of the entry is replaced.
- ``"grouping"``: the transform receives the whole ``data`` list and returns a list.
- ``"entire_sample"``: the transform receives and returns the whole sample dict.

An ``"image"`` or ``"labels"`` transform may also return a dict (VISSL's generalised
transform, e.g. the masking transforms' ``{"data": image, "mask": mask}``): ``data``
replaces the entry and every other value is appended to ``sample[key]`` (one value per
transformed entry).

A transform declares its kind with a class attribute ``ssl_transform_kind``; VISSL's
transform names are also recognised. A transform class with a classmethod
``from_transform_config(kwargs, key_path)`` is built by it (instead of ``cls(**kwargs)``),
so that its errors can name the exact key, e.g. ``config.DATA.TRAIN.TRANSFORMS[3].prob``.

This module sits below :mod:`~vissl.data.ssl_transforms.tensor_path` (which builds these
wrappers) and :mod:`~vissl.data.ssl_transforms.ssl_transforms_wrapper` (which builds a
chain from config and re-exports the names defined here).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vissl.data.ssl_transforms.registry import get_transform
from vissl.errors import ConfigError, UnknownNameError

#: The name of the wrapper that starts the tensor path (see ``tensor_path``).
TENSOR_PATH_START = "ToImageTensor"
#: VISSL's transform names per kind (for transforms without ``ssl_transform_kind``).
TRANSFORMS_WITH_LABELS = frozenset({"ImgRotatePil", "ShuffleImgPatches"})
TRANSFORMS_WITH_COPIES = frozenset(
    {"ImgReplicatePil", "ImgPilToPatchesAndImage", "ImgPilToMultiCrop"}
)
TRANSFORMS_WITH_GROUPING = frozenset({"ImgPilMultiCropRandomApply"})
TRANSFORMS_WITH_ENTIRE_SAMPLE: frozenset[str] = frozenset()

KINDS = ("image", "copies", "labels", "grouping", "entire_sample")
_RESERVED_KEYS = ("name", "indices", "transform_type")
_ALIGNED_KEYS = ("label", "data_valid", "data_idx")


def transform_kind(name: str, transform: Any) -> str:
    """The kind of ``transform`` (see the module docstring)."""
    kind = getattr(transform, "ssl_transform_kind", None)
    if kind is not None:
        return str(kind)
    if name in TRANSFORMS_WITH_COPIES:
        return "copies"
    if name in TRANSFORMS_WITH_LABELS:
        return "labels"
    if name in TRANSFORMS_WITH_GROUPING:
        return "grouping"
    if name in TRANSFORMS_WITH_ENTIRE_SAMPLE:
        return "entire_sample"
    return "image"


def _signature(cls: Any) -> str:
    try:
        return f"{cls.__name__}{inspect.signature(cls)}"
    except (TypeError, ValueError):
        return getattr(cls, "__name__", repr(cls))


def _parse_indices(value: Any, key_path: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise ConfigError(
            f"{key_path}.indices must be a list of integers, got {value!r}.",
            f"{key_path}.indices",
        )
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConfigError(
                f"{key_path}.indices must hold non-negative integers, got {value!r}.",
                f"{key_path}.indices",
            )
        out.append(item)
    return tuple(sorted(set(out)))


class SSLTransformsWrapper:
    """Apply one transform to the selected entries of a sample dict.

    Args:
        transform: the callable applied to each selected entry.
        name: the transform's config name (used to find its kind and in messages).
        indices: the entries of ``sample["data"]`` to transform; empty means all.
        kind: one of :data:`KINDS`; inferred from the transform when None.
        key_path: the config key of this entry, e.g. ``config.DATA.TRAIN.TRANSFORMS[2]``.
    """

    def __init__(
        self,
        transform: Callable[..., Any],
        name: str,
        indices: Sequence[int] = (),
        kind: str | None = None,
        key_path: str = "config.DATA.<split>.TRANSFORMS[]",
    ) -> None:
        self.transform = transform
        self.name = name
        self.indices = tuple(sorted(set(indices)))
        self.kind = kind if kind is not None else transform_kind(name, transform)
        if self.kind not in KINDS:
            raise ValueError(f"unknown transform kind {self.kind!r}; expected one of {KINDS}")
        self.key_path = key_path

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], key_path: str = "config.DATA.<split>.TRANSFORMS[]"
    ) -> SSLTransformsWrapper:
        """Build from one entry of ``DATA.<split>.TRANSFORMS``.

        Raises:
            ConfigError: a malformed entry or arguments the transform rejects.
            UnknownNameError: the name is neither registered nor in torchvision.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"{key_path} must be a mapping like {{name: RandomHorizontalFlip, p: 0.5}}, "
                f"got {config!r}.",
                key_path,
            )
        name = config.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"{key_path} has no 'name': every transform entry needs one, e.g. "
                "{name: ToTensor}.",
                key_path,
            )
        transform_type = config.get("transform_type")
        if transform_type not in (None, "", "torchvision", "vissl"):
            raise ConfigError(
                f"{key_path}.transform_type={transform_type!r} is not supported "
                "(VISSL's 'augly' transforms are not available in vissl).",
                f"{key_path}.transform_type",
            )
        indices = _parse_indices(config.get("indices"), key_path)
        kwargs = {k: v for k, v in config.items() if k not in _RESERVED_KEYS}
        try:
            transform_cls = get_transform(name)
        except UnknownNameError as err:
            raise UnknownNameError(f"{key_path}.name: {err}") from None
        builder = getattr(transform_cls, "from_transform_config", None)
        try:
            if callable(builder):
                # A transform that checks its own keys and names them in its errors.
                transform = builder(kwargs, key_path=key_path)
            else:
                transform = transform_cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{key_path} ({name}): cannot build the transform with arguments "
                f"{kwargs}: {err}. Its signature: {_signature(transform_cls)}.",
                key_path,
            ) from err
        return cls(transform, name, indices, key_path=key_path)

    def _selected(self, num_entries: int) -> tuple[int, ...]:
        if not self.indices:
            return tuple(range(num_entries))
        bad = [i for i in self.indices if i >= num_entries]
        if bad:
            raise ConfigError(
                f"{self.key_path}.indices {list(self.indices)} ({self.name}): the sample "
                f"has only {num_entries} data entries at this point, so {bad} do not exist.",
                f"{self.key_path}.indices",
            )
        return self.indices

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Transform ``sample`` (in place) and return it."""
        if self.kind == "entire_sample":
            return self.transform(sample)
        if self.kind == "grouping":
            sample["data"] = list(self.transform(sample["data"]))
        else:
            for idx in self._selected(len(sample["data"])):
                output = self.transform(sample["data"][idx])
                if isinstance(output, Mapping):  # VISSL's generalised transform
                    sample["data"][idx] = output["data"]
                    for key, value in output.items():
                        if key != "data":
                            sample.setdefault(key, []).append(value)
                elif self.kind == "labels":
                    sample["data"][idx], sample["label"][idx] = output[0], output[1]
                else:
                    sample["data"][idx] = output
        if self.kind == "copies":
            self._flatten(sample)
        return sample

    @staticmethod
    def _flatten(sample: dict[str, Any]) -> None:
        entries = sample["data"]
        counts = [len(e) if isinstance(e, list | tuple) else 1 for e in entries]
        data: list[Any] = []
        for entry in entries:
            data.extend(entry if isinstance(entry, list | tuple) else [entry])
        for key in _ALIGNED_KEYS:
            values = sample.get(key)
            if values is not None and len(values) == len(entries):
                sample[key] = [v for v, n in zip(values, counts) for _ in range(n)]
        sample["data"] = data

    def __repr__(self) -> str:
        where = f", indices={list(self.indices)}" if self.indices else ""
        return f"SSLTransformsWrapper({self.transform!r}{where})"


class SSLTransformsCompose:
    """Apply a list of :class:`SSLTransformsWrapper` in order."""

    def __init__(self, transforms: Sequence[SSLTransformsWrapper]) -> None:
        self.transforms = list(transforms)

    @property
    def takes_image_tensors(self) -> bool:
        """Whether the chain starts on tensors (the tensor path begins with it): the data
        sources may then give ``(C, H, W)`` uint8 tensors instead of PIL images."""
        return bool(self.transforms) and self.transforms[0].name == TENSOR_PATH_START

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for transform in self.transforms:
            sample = transform(sample)
        return sample

    def __len__(self) -> int:
        return len(self.transforms)

    def __repr__(self) -> str:
        rows = "".join(f"\n  {t!r}" for t in self.transforms)
        return f"SSLTransformsCompose({rows}\n)"
