"""Shared machinery of the top-k list meters (accuracy, precision@k, recall@k).

A list meter holds one set of counters per model output (``num_meters``). Counts live in
tensors on the device of the model output, so ``update`` never reads values back to the
host; only ``value`` does. As in ClassyVision, counts since the last ``sync_state`` are
kept apart ("current") from the globally synced totals, and ``sync_state`` all-reduces
only the current counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vissl.errors import ConfigError
from vissl.utils.distributed import all_reduce_sum


def _count_dtype(device: torch.device) -> torch.dtype:
    # float64 keeps integer counts exact far beyond any dataset size; MPS lacks it.
    return torch.float32 if device.type == "mps" else torch.float64


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


class TopKListMeter:
    """Base of the list meters; subclasses define :meth:`_counts` and :meth:`_ratio`.

    Args:
        num_meters: number of model outputs measured (one set of counters each).
        topk_values: the ``k`` values, e.g. ``[1, 5]``.
        meter_names: optional names of the outputs, used as keys of :attr:`value`
            (several outputs may share a name; their values then form a list).
        device: where the counters live (the task's device, so that ``sync_state``
            all-reduces them with NCCL even when the meter was never updated).
    """

    #: registry name, also the ``METERS.<name>`` config block.
    NAME = ""
    #: :meth:`update` takes ``valid=`` (rows to skip, such as the sampler's padding).
    supports_valid_mask = True

    def __init__(
        self,
        num_meters: int = 1,
        topk_values: Sequence[int] = (1,),
        meter_names: Sequence[str] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        key = f"config.METERS.{self.NAME}"
        if not _is_pos_int(num_meters):
            raise ConfigError(
                f"{key}.num_meters must be a positive integer, got {num_meters!r}.",
                f"{key}.num_meters",
            )
        if isinstance(topk_values, str | bytes) or not isinstance(topk_values, Sequence):
            raise ConfigError(
                f"{key}.topk_values must be a list of positive integers, got {topk_values!r}.",
                f"{key}.topk_values",
            )
        if len(topk_values) == 0 or not all(_is_pos_int(k) for k in topk_values):
            raise ConfigError(
                f"{key}.topk_values must be a non-empty list of positive integers, got "
                f"{list(topk_values)!r}.",
                f"{key}.topk_values",
            )
        names = list(meter_names or [])
        if names and len(names) != num_meters:
            raise ConfigError(
                f"{key}.meter_names has {len(names)} names but num_meters is {num_meters}; "
                "give one name per output or none.",
                f"{key}.meter_names",
            )
        self._num_meters = int(num_meters)
        self._topk_values = [int(k) for k in topk_values]
        self._meter_names = names
        self._device = torch.device("cpu" if device is None else device)
        self.reset()

    # ------------------------------------------------------------------ config
    @classmethod
    def from_config(
        cls,
        meters_config: Mapping[str, Any] | None,
        device: torch.device | str | None = None,
    ) -> TopKListMeter:
        """Build from ``METERS.<name>`` (``num_meters``, ``topk_values``, ``meter_names``)."""
        cfg = meters_config or {}
        return cls(
            num_meters=cfg.get("num_meters", 1),
            topk_values=cfg.get("topk_values", [1]),
            meter_names=cfg.get("meter_names") or [],
            device=device,
        )

    @property
    def name(self) -> str:
        """The meter's registry name."""
        return self.NAME

    @property
    def num_meters(self) -> int:
        return self._num_meters

    @property
    def topk_values(self) -> list[int]:
        return list(self._topk_values)

    @property
    def meter_names(self) -> list[str]:
        return list(self._meter_names)

    @property
    def device(self) -> torch.device:
        """Where the counters live."""
        return self._device

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Zero every counter (current and synced), on the meter's device."""
        dtype = _count_dtype(self._device)
        shape = (self._num_meters, len(self._topk_values))
        self._curr_hits = torch.zeros(shape, dtype=dtype, device=self._device)
        self._total_hits = torch.zeros(shape, dtype=dtype, device=self._device)
        self._curr_denom = torch.zeros(self._num_meters, dtype=dtype, device=self._device)
        self._total_denom = torch.zeros(self._num_meters, dtype=dtype, device=self._device)
        # All-zero counters can be re-created on another device instead of copied there
        # (a host-to-device copy of pageable memory would synchronise).
        self._pristine = True

    def _move_to(self, device: torch.device) -> None:
        if device == self._device:
            return
        if self._pristine:
            self._device = device
            self.reset()
            return
        dtype = _count_dtype(device)
        self._curr_hits = self._curr_hits.to(device=device, dtype=dtype)
        self._total_hits = self._total_hits.to(device=device, dtype=dtype)
        self._curr_denom = self._curr_denom.to(device=device, dtype=dtype)
        self._total_denom = self._total_denom.to(device=device, dtype=dtype)
        self._device = device

    def sync_state(self) -> None:
        """Sum the counts since the last sync over all ranks and add them to the totals."""
        packed = torch.cat([self._curr_hits.reshape(-1), self._curr_denom])
        all_reduce_sum(packed)
        n = self._curr_hits.numel()
        self._total_hits += packed[:n].view_as(self._curr_hits)
        self._total_denom += packed[n:]
        self._curr_hits.zero_()
        self._curr_denom.zero_()

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (CPU tensors)."""
        return {
            "name": self.name,
            "num_meters": self._num_meters,
            "topk_values": list(self._topk_values),
            "total_hits": self._total_hits.detach().cpu().clone(),
            "total_denom": self._total_denom.detach().cpu().clone(),
            "curr_hits": self._curr_hits.detach().cpu().clone(),
            "curr_denom": self._curr_denom.detach().cpu().clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: when the state belongs to a meter of another name or shape.
        """
        if state.get("name") != self.name:
            raise ValueError(f"meter state of {state.get('name')!r} given to {self.name!r}.")
        if (
            state.get("num_meters") != self._num_meters
            or list(state.get("topk_values", [])) != self._topk_values
        ):
            raise ValueError(
                f"{self.name}: the state has num_meters={state.get('num_meters')} and "
                f"topk_values={state.get('topk_values')}, this meter "
                f"num_meters={self._num_meters} and topk_values={self._topk_values}."
            )
        dtype = _count_dtype(self._device)
        self._total_hits = state["total_hits"].to(device=self._device, dtype=dtype).clone()
        self._total_denom = state["total_denom"].to(device=self._device, dtype=dtype).clone()
        self._curr_hits = state["curr_hits"].to(device=self._device, dtype=dtype).clone()
        self._curr_denom = state["curr_denom"].to(device=self._device, dtype=dtype).clone()
        self._pristine = False

    # VISSL / ClassyVision spellings.
    def get_classy_state(self) -> dict[str, Any]:
        """Alias of :meth:`state_dict`."""
        return self.state_dict()

    def set_classy_state(self, state: Mapping[str, Any]) -> None:
        """Alias of :meth:`load_state_dict`."""
        self.load_state_dict(state)

    # ------------------------------------------------------------------ update
    def _counts(
        self, output: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Per-k hit counts ``(len(topk_values),)`` and the denominator of one batch.

        ``weight`` is ``None`` (every row counts) or a ``(B,)`` float tensor of 0/1 row
        weights. The denominator is a 0-d tensor or a Python number known from shapes alone.
        """
        raise NotImplementedError

    def _ratio(self, hits: float, denom: float, k: int) -> float:
        """The meter's value for one output and one ``k``, as a fraction."""
        raise NotImplementedError

    def _topk_classes(self, output: torch.Tensor) -> torch.Tensor:
        max_k = max(self._topk_values)
        if max_k > output.shape[1]:
            raise ConfigError(
                f"config.METERS.{self.name}.topk_values asks for top-{max_k} but the model "
                f"output has only {output.shape[1]} classes.",
                f"config.METERS.{self.name}.topk_values",
            )
        return output.detach().float().topk(max_k, dim=1, largest=True, sorted=True).indices

    def _one_hot_target(self, target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` 0/1 (or soft) targets from class indices ``(B,)``/``(B, 1)`` or ``(B, C)``."""
        if target.ndim == 2 and target.shape == output.shape:
            return target.detach().float()
        if target.ndim == 2 and target.shape[1] == 1:
            target = target[:, 0]
        if target.ndim != 1 or target.shape[0] != output.shape[0]:
            raise ValueError(
                f"{self.name}: target of shape {tuple(target.shape)} does not match the "
                f"output {tuple(output.shape)}; give (B,) class indices or (B, C) targets."
            )
        one_hot = torch.zeros(output.shape, dtype=torch.float32, device=output.device)
        return one_hot.scatter_(1, target.detach().long().view(-1, 1), 1.0)

    def update(
        self,
        model_output: torch.Tensor | Sequence[torch.Tensor],
        target: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> None:
        """Add one batch; never reads values back to the host.

        Args:
            model_output: a ``(B, C)`` tensor, or a list of ``num_meters`` of them
                (logits or probabilities).
            target: ``(B,)`` class indices or ``(B, C)`` one-hot / multi-label targets.
            valid: optional ``(B,)`` flags; rows whose flag is 0 are not counted (VISSL's
                ``data_valid``, 0 for the duplicates a ``DistributedSampler`` pads with).
        """
        outputs = [model_output] if isinstance(model_output, torch.Tensor) else list(model_output)
        if len(outputs) != self._num_meters:
            raise ConfigError(
                f"config.METERS.{self.name}.num_meters is {self._num_meters} but the model "
                f"returned {len(outputs)} outputs; set num_meters to {len(outputs)}.",
                f"config.METERS.{self.name}.num_meters",
            )
        for out in outputs:
            if out.ndim != 2:
                raise ValueError(
                    f"{self.name}: each model output must be (B, C), got {tuple(out.shape)}."
                )
        if valid is not None and (valid.ndim != 1 or valid.shape[0] != outputs[0].shape[0]):
            raise ValueError(
                f"{self.name}: valid flags of shape {tuple(valid.shape)} do not match the "
                f"batch of {outputs[0].shape[0]} rows."
            )
        self._move_to(outputs[0].device)
        self._pristine = False
        weight = None if valid is None else valid.to(outputs[0].device).ne(0).to(torch.float32)
        for i, out in enumerate(outputs):
            if out.shape[0] == 0:
                continue
            hits, denom = self._counts(out, target.to(out.device), weight)
            self._curr_hits[i] += hits.to(self._curr_hits.device, self._curr_hits.dtype)
            if isinstance(denom, torch.Tensor):
                denom = denom.to(self._curr_denom.device, self._curr_denom.dtype)
            self._curr_denom[i] += denom

    # ------------------------------------------------------------------ value
    @property
    def value(self) -> dict[str, dict[Any, float | list[float]]]:
        """VISSL's format: ``{"top_k": {name_or_index: percent, ...}, ...}``.

        Percentages are ``100 * round(fraction, 6)`` (VISSL's rounding), without binary
        noise (``88.5794``, not ``88.57939999999999``). Outputs sharing a meter name give
        a list of values under that name. Includes counts not yet synced.
        """
        hits = (self._total_hits + self._curr_hits).tolist()
        denom = (self._total_denom + self._curr_denom).tolist()
        result: dict[str, dict[Any, Any]] = {}
        for j, k in enumerate(self._topk_values):
            per_name: dict[Any, list[float]] = {}
            for i in range(self._num_meters):
                key = self._meter_names[i] if self._meter_names else i
                frac = self._ratio(hits[i][j], denom[i], k) if denom[i] else 0.0
                per_name.setdefault(key, []).append(round(100.0 * round(float(frac), 6), 4))
            result[f"top_{k}"] = {
                key: vals[0] if len(vals) == 1 else vals for key, vals in per_name.items()
            }
        return result

    def validate(self, model_output_shape: Sequence[int], target_shape: Sequence[int]) -> None:
        """Kept for VISSL compatibility; checks happen in :meth:`update`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, num_meters={self._num_meters}, topk_values={self._topk_values})"
