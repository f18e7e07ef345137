"""``AttrDict``: a dict with attribute access, as in VISSL (``cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA``)."""

from __future__ import annotations

from typing import Any


class AttrDict(dict[str, Any]):
    """A recursive dict whose keys are also attributes. Picklable.

    Nested dicts (also inside lists) are converted on construction and on assignment.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    @staticmethod
    def _wrap(value: Any) -> Any:
        if isinstance(value, dict) and not isinstance(value, AttrDict):
            return AttrDict(value)
        if isinstance(value, list):
            return [AttrDict._wrap(v) for v in value]
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, self._wrap(value))

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(
                f"config has no key {key!r}; available keys: {sorted(self.keys())}"
            ) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            self[key] = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (AttrDict, (dict(self),))

    def to_dict(self) -> dict[str, Any]:
        """A plain-``dict`` deep copy (for YAML dumps and checkpoints)."""

        def plain(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [plain(x) for x in v]
            return v

        return plain(self)
