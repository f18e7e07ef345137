"""``mean_ap_list_meter``: mean AP of each model output (multi-label, e.g. VOC07 linear eval).

One :class:`~vissl.meters.mean_ap_meter.MeanAPMeter` per output (``num_meters``: several
heads, or the layers of ``LINEAR_EVAL_FEAT_POOL_OPS_MAP``), all against the same
``(B, C)`` targets (1 present, 0 absent, -1 ignored). Outputs are logits. AP depends only
on the order of the scores, so the logits themselves are ranked: VISSL ranked their
sigmoid, the same order except where float32's sigmoid rounds large logits (above about
17) to a tie at 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vissl.errors import ConfigError
from vissl.meters import register_meter
from vissl.meters.mean_ap_meter import MeanAPMeter

_KEY = "config.METERS.mean_ap_list_meter"


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


@register_meter("mean_ap_list_meter")
class MeanAPListMeter:
    """Mean AP of each of ``num_meters`` outputs.

    Args:
        num_classes: number of classes ``C`` of the outputs and targets.
        num_meters: number of model outputs measured.
        meter_names: optional names of the outputs (keys of :attr:`value`; outputs that
            share a name give a list of values under it).
        max_cpu_capacity: the most samples each meter may hold; -1: no limit.
        device: where unsynced batches live before the first one (the task's device).

    ``value`` is VISSL's ``{"mAP": {output: percent}, "AP": {output: [per-class AP]}}``
    (mAP in percent, ``100 * round(fraction, 6)``; per-class APs as fractions, -1 for a
    class without a positive sample).
    """

    NAME = "mean_ap_list_meter"
    supports_valid_mask = True

    def __init__(
        self,
        num_classes: int,
        num_meters: int = 1,
        meter_names: Sequence[str] | None = None,
        max_cpu_capacity: int = -1,
        device: torch.device | str | None = None,
    ) -> None:
        if not _is_pos_int(num_meters):
            raise ConfigError(
                f"{_KEY}.num_meters must be a positive integer, got {num_meters!r}.",
                f"{_KEY}.num_meters",
            )
        names = list(meter_names or [])
        if names and len(names) != num_meters:
            raise ConfigError(
                f"{_KEY}.meter_names has {len(names)} names but num_meters is {num_meters}; "
                "give one name per output or none.",
                f"{_KEY}.meter_names",
            )
        self._num_meters = int(num_meters)
        self._meter_names = names
        self._meters = [
            MeanAPMeter(num_classes, max_cpu_capacity, device=device, key=_KEY)
            for _ in range(self._num_meters)
        ]
        self.num_classes = self._meters[0].num_classes

    @classmethod
    def from_config(
        cls, meters_config: Mapping[str, Any] | None, device: torch.device | str | None = None
    ) -> MeanAPListMeter:
        """Build from ``METERS.mean_ap_list_meter`` (``num_classes``, ``num_meters``,
        ``meter_names``, ``max_cpu_capacity``)."""
        cfg = meters_config or {}
        return cls(
            num_classes=cfg.get("num_classes"),  # type: ignore[arg-type]
            num_meters=cfg.get("num_meters", 1),
            meter_names=cfg.get("meter_names") or [],
            max_cpu_capacity=cfg.get("max_cpu_capacity", -1),
            device=device,
        )

    @property
    def name(self) -> str:
        return self.NAME

    @property
    def num_meters(self) -> int:
        return self._num_meters

    @property
    def meter_names(self) -> list[str]:
        return list(self._meter_names)

    @property
    def meters(self) -> list[MeanAPMeter]:
        """The per-output meters."""
        return list(self._meters)

    def reset(self) -> None:
        for meter in self._meters:
            meter.reset()

    def sync_state(self) -> None:
        """Gather every rank's rows (a collective: every rank calls it)."""
        for meter in self._meters:
            meter.sync_state()

    def update(
        self,
        model_output: torch.Tensor | Sequence[torch.Tensor],
        target: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> None:
        """Add one batch: each ``(B, C)`` output (ranked as its sigmoid would be) against
        ``(B, C)`` targets.

        Args:
            model_output: a ``(B, C)`` tensor of logits, or a list of ``num_meters`` of them.
            target: ``(B, C)`` targets in {1, 0, -1} (or ``(B,)`` class indices).
            valid: optional ``(B,)`` flags; rows flagged 0 (padding) are not counted.
        """
        outputs = [model_output] if isinstance(model_output, torch.Tensor) else list(model_output)
        if len(outputs) != self._num_meters:
            raise ConfigError(
                f"{_KEY}.num_meters is {self._num_meters} but the model returned "
                f"{len(outputs)} outputs; set num_meters to {len(outputs)}.",
                f"{_KEY}.num_meters",
            )
        for meter, out in zip(self._meters, outputs, strict=True):
            if not isinstance(out, torch.Tensor):
                raise ValueError(f"{self.name}: each model output must be a tensor.")
            meter.update(out.detach().float(), target, valid=valid)

    @property
    def value(self) -> dict[str, dict[Any, Any]]:
        """``{"mAP": {output: percent}, "AP": {output: [per-class AP fractions]}}``."""
        maps: dict[Any, list[float]] = {}
        aps: dict[Any, list[list[float]]] = {}
        for i, meter in enumerate(self._meters):
            key = self._meter_names[i] if self._meter_names else i
            val = meter.value
            maps.setdefault(key, []).append(round(100.0 * round(val["mAP"], 6), 4))
            aps.setdefault(key, []).append(val["AP"])
        return {
            "mAP": {k: v[0] if len(v) == 1 else v for k, v in maps.items()},
            "AP": {k: v[0] if len(v) == 1 else v for k, v in aps.items()},
        }

    def state_dict(self) -> dict[str, Any]:
        """The per-output meters' states."""
        return {
            "name": self.name,
            "num_meters": self._num_meters,
            "meters": [m.state_dict() for m in self._meters],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: a state of another meter or number of outputs.
        """
        if state.get("name") != self.name or state.get("num_meters") != self._num_meters:
            raise ValueError(
                f"{self.name}: cannot load the state of {state.get('name')!r} with "
                f"num_meters={state.get('num_meters')} (this meter: {self._num_meters})."
            )
        for meter, sub in zip(self._meters, state["meters"], strict=True):
            meter.load_state_dict(sub)

    def get_classy_state(self) -> dict[str, Any]:
        """Alias of :meth:`state_dict` (VISSL's name)."""
        return self.state_dict()

    def set_classy_state(self, state: Mapping[str, Any]) -> None:
        """Alias of :meth:`load_state_dict` (VISSL's name)."""
        self.load_state_dict(state)

    def validate(self, model_output_shape: Sequence[int], target_shape: Sequence[int]) -> None:
        """Kept for VISSL compatibility; checks happen in :meth:`update`."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_meters={self._num_meters}, num_classes={self.num_classes})"
        )
