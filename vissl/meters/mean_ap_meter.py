"""``mean_ap_meter``: mean average precision of multi-label predictions (e.g. VOC07).

The meter keeps every sample's scores and targets, since AP ranks the whole set. Targets
are VISSL's multi-label arrays: per class ``1`` present, ``0`` absent, ``-1`` ignored (a
"difficult" VOC object): an ignored sample is left out of that class's ranking. Each
class's AP is the area under the interpolated precision-recall curve (VISSL's measure,
the PASCAL VOC 2010+ one, :func:`vissl.evaluation.svm.interpolated_ap`); the mAP is the
mean over the classes that have at least one positive (the others report AP ``-1``).

Batches stay on the device they came from (``update`` never reads values back to the
host). ``sync_state`` gathers the rows of every rank, so the value after a sync is that of
the whole data set, identical on every rank; rows flagged as padding (``data_valid`` 0)
are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vissl.errors import ConfigError
from vissl.evaluation.svm import interpolated_ap
from vissl.meters import register_meter
from vissl.utils.distributed import get_world_size, is_distributed

logger = logging.getLogger(__name__)


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ``(n_r, D)`` of every rank concatenated in rank order (ranks may differ in
    ``n_r``); ``rows`` itself with one process. A collective: every rank must call it."""
    if not is_distributed() or get_world_size() == 1:
        return rows
    world = get_world_size()
    size = torch.tensor([rows.shape[0]], dtype=torch.int64, device=rows.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    longest = max(counts)
    padded = rows.new_zeros((longest, *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded.contiguous())
    return torch.cat([chunk[:n] for chunk, n in zip(out, counts, strict=True)])


def average_precisions(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-class AP of ``(N, C)`` scores against ``(N, C)`` targets in ``{1, 0, -1}``.

    A class without a positive gets ``-1``; samples with target ``-1`` do not count for
    that class.
    """
    aps = np.full(targets.shape[1], -1.0)
    for c in range(targets.shape[1]):
        column = targets[:, c]
        if not (column == 1).any():
            continue
        counted = column != -1
        aps[c] = interpolated_ap(scores[counted, c], column[counted])
    return aps


@register_meter("mean_ap_meter")
class MeanAPMeter:
    """Mean AP over classes of ``(B, C)`` scores against ``(B, C)`` targets in {1, 0, -1}.

    Args:
        num_classes: ``C``, the number of columns of the scores and targets.
        max_cpu_capacity: the most samples the meter may hold (all ranks together after a
            sync); ``-1``: no limit. More raise an error instead of running out of memory.
        device: where unsynced batches live when none was seen yet (the task's device).
        key: config path of the meter's parameters, for error messages.

    ``value`` is VISSL's ``{"mAP": fraction, "AP": [per-class AP, -1 when no positive]}``.
    Scores are used as given (probabilities or logits: AP depends only on their order);
    class-index targets ``(B,)`` are turned into one-hot rows.
    """

    NAME = "mean_ap_meter"
    #: :meth:`update` takes ``valid=`` (rows to skip, such as the sampler's padding).
    supports_valid_mask = True

    def __init__(
        self,
        num_classes: int,
        max_cpu_capacity: int = -1,
        device: torch.device | str | None = None,
        key: str = "config.METERS.mean_ap_meter",
    ) -> None:
        if not _is_pos_int(num_classes):
            raise ConfigError(
                f"{key}.num_classes must be a positive integer (the number of classes of the "
                f"multi-label targets, e.g. 20 for VOC07), got {num_classes!r}.",
                f"{key}.num_classes",
            )
        if not isinstance(max_cpu_capacity, int) or isinstance(max_cpu_capacity, bool):
            raise ConfigError(
                f"{key}.max_cpu_capacity must be an integer (-1: no limit), got "
                f"{max_cpu_capacity!r}.",
                f"{key}.max_cpu_capacity",
            )
        self.num_classes = int(num_classes)
        self.max_cpu_capacity = int(max_cpu_capacity)
        self._key = key
        self._device = torch.device("cpu" if device is None else device)
        self.reset()

    @classmethod
    def from_config(
        cls, meters_config: Mapping[str, Any] | None, device: torch.device | str | None = None
    ) -> MeanAPMeter:
        """Build from ``METERS.mean_ap_meter`` (``num_classes``, ``max_cpu_capacity``)."""
        cfg = meters_config or {}
        return cls(
            num_classes=cfg.get("num_classes"),  # type: ignore[arg-type]
            max_cpu_capacity=cfg.get("max_cpu_capacity", -1),
            device=device,
        )

    @property
    def name(self) -> str:
        return self.NAME

    @property
    def device(self) -> torch.device:
        return self._device

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every sample (synced and unsynced)."""
        c = self.num_classes
        self._total_scores = torch.zeros((0, c), dtype=torch.float32)
        self._total_targets = torch.zeros((0, c), dtype=torch.int8)
        self._total_keep = torch.zeros(0, dtype=torch.bool)
        # unsynced batches of this rank: (scores, targets, keep) on their device
        self._curr: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._curr_rows = 0

    @property
    def num_samples(self) -> int:
        """Rows held (synced plus this rank's unsynced ones, padding included)."""
        return int(self._total_scores.shape[0]) + self._curr_rows

    def _curr_tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if not self._curr:
            c = self.num_classes
            return (
                torch.zeros((0, c), dtype=torch.float32, device=device),
                torch.zeros((0, c), dtype=torch.int8, device=device),
                torch.zeros(0, dtype=torch.bool, device=device),
            )
        return tuple(torch.cat([part[i].to(device) for part in self._curr]) for i in range(3))

    def sync_state(self) -> None:
        """Gather the unsynced rows of every rank into the synced set (a collective)."""
        device = self._curr[0][0].device if self._curr else self._device
        scores, targets, keep = self._curr_tensors(device)
        c = self.num_classes
        packed = torch.cat([scores, targets.to(torch.float32), keep.to(torch.float32)[:, None]], 1)
        gathered = gather_rows(packed).cpu()
        self._total_scores = torch.cat([self._total_scores, gathered[:, :c]])
        self._total_targets = torch.cat(
            [self._total_targets, gathered[:, c : 2 * c].to(torch.int8)]
        )
        self._total_keep = torch.cat([self._total_keep, gathered[:, 2 * c] != 0])
        self._curr = []
        self._curr_rows = 0
        self._check_capacity(0)

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (CPU tensors): the synced rows and this rank's unsynced ones."""
        scores, targets, keep = self._curr_tensors(torch.device("cpu"))
        return {
            "name": self.name,
            "num_classes": self.num_classes,
            "scores": self._total_scores.clone(),
            "targets": self._total_targets.clone(),
            "keep": self._total_keep.clone(),
            "curr_scores": scores.detach().cpu().clone(),
            "curr_targets": targets.detach().cpu().clone(),
            "curr_keep": keep.detach().cpu().clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: the state belongs to a meter of another name or number of classes.
        """
        if state.get("name") != self.name:
            raise ValueError(f"meter state of {state.get('name')!r} given to {self.name!r}.")
        if state.get("num_classes") != self.num_classes:
            raise ValueError(
                f"{self.name}: the state has num_classes={state.get('num_classes')}, this "
                f"meter {self.num_classes}."
            )
        self.reset()
        self._total_scores = state["scores"].to(torch.float32).cpu().clone()
        self._total_targets = state["targets"].to(torch.int8).cpu().clone()
        self._total_keep = state["keep"].to(torch.bool).cpu().clone()
        if state["curr_scores"].shape[0]:
            self._curr = [
                (
                    state["curr_scores"].to(torch.float32).clone(),
                    state["curr_targets"].to(torch.int8).clone(),
                    state["curr_keep"].to(torch.bool).clone(),
                )
            ]
            self._curr_rows = int(state["curr_scores"].shape[0])

    def get_classy_state(self) -> dict[str, Any]:
        """Alias of :meth:`state_dict` (VISSL's name)."""
        return self.state_dict()

    def set_classy_state(self, state: Mapping[str, Any]) -> None:
        """Alias of :meth:`load_state_dict` (VISSL's name)."""
        self.load_state_dict(state)

    # ------------------------------------------------------------------ update
    def _check_capacity(self, extra: int) -> None:
        held = self.num_samples + extra
        if 0 < self.max_cpu_capacity < held:
            raise ValueError(
                f"{self.name}: {held} samples exceed {self._key}.max_cpu_capacity="
                f"{self.max_cpu_capacity}; raise it (-1: no limit) to at least the size of "
                "the evaluated split."
            )

    def _targets_of(self, target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        if target.ndim == 1 and target.shape[0] == output.shape[0]:
            one_hot = torch.zeros(output.shape, dtype=torch.int8, device=output.device)
            return one_hot.scatter_(1, target.long().view(-1, 1).to(output.device), 1)
        if target.ndim != 2 or target.shape != output.shape:
            raise ValueError(
                f"{self.name}: target of shape {tuple(target.shape)} does not match the model "
                f"output {tuple(output.shape)}; give (B, C) multi-label targets (1 present, "
                "0 absent, -1 ignored) or (B,) class indices."
            )
        return target.detach().to(device=output.device, dtype=torch.int8)

    def update(
        self, model_output: torch.Tensor, target: torch.Tensor, valid: torch.Tensor | None = None
    ) -> None:
        """Add one batch of ``(B, C)`` scores and targets; never reads values back to the host.

        Args:
            model_output: ``(B, C)`` scores (probabilities or logits).
            target: ``(B, C)`` targets in {1, 0, -1}, or ``(B,)`` class indices.
            valid: optional ``(B,)`` flags; rows whose flag is 0 (the padding a
                ``DistributedSampler`` adds) are not counted.
        """
        if not isinstance(model_output, torch.Tensor) or model_output.ndim != 2:
            shape = getattr(model_output, "shape", type(model_output).__name__)
            raise ValueError(f"{self.name}: the model output must be (B, C), got {shape}.")
        if model_output.shape[1] != self.num_classes:
            raise ConfigError(
                f"{self._key}.num_classes is {self.num_classes} but the model output has "
                f"{model_output.shape[1]} columns; set num_classes to {model_output.shape[1]}.",
                f"{self._key}.num_classes",
            )
        rows = int(model_output.shape[0])
        if valid is not None and (valid.ndim != 1 or valid.shape[0] != rows):
            raise ValueError(
                f"{self.name}: valid flags of shape {tuple(valid.shape)} do not match the "
                f"batch of {rows} rows."
            )
        self._check_capacity(rows)
        out = model_output.detach().to(torch.float32)
        targets = self._targets_of(target, out)
        if valid is None:
            keep = torch.ones(rows, dtype=torch.bool, device=out.device)
        else:
            keep = valid.detach().to(out.device).ne(0)
        self._device = out.device
        self._curr.append((out, targets, keep))
        self._curr_rows += rows

    # ------------------------------------------------------------------ value
    def _rows(self) -> tuple[np.ndarray, np.ndarray]:
        scores, targets, keep = self._curr_tensors(torch.device("cpu"))
        all_scores = torch.cat([self._total_scores, scores.cpu()])
        all_targets = torch.cat([self._total_targets, targets.cpu()])
        all_keep = torch.cat([self._total_keep, keep.cpu()])
        s = all_scores[all_keep].numpy().astype(np.float64)
        t = all_targets[all_keep].numpy().astype(np.int64)
        bad = ~np.isin(t, (-1, 0, 1))
        if bad.any():
            raise ValueError(
                f"{self.name}: targets must be 1 (present), 0 (absent) or -1 (ignored); got "
                f"{sorted(set(t[bad].tolist()))[:5]}."
            )
        return s, t

    def average_precisions(self) -> np.ndarray:
        """Per-class AP over every held row (``-1`` for a class without positives)."""
        scores, targets = self._rows()
        return average_precisions(scores, targets)

    @property
    def value(self) -> dict[str, Any]:
        """``{"mAP": mean AP over classes with a positive (a fraction; 0 without any),
        "AP": [per-class AP, -1 for a class without a positive]}``; includes unsynced rows."""
        aps = self.average_precisions()
        present = aps[aps != -1]
        if present.size < self.num_classes:
            logger.debug(
                "%s: %d of %d classes have a positive sample", self.name, present.size, aps.size
            )
        mean_ap = float(present.mean()) if present.size else 0.0
        return {"mAP": mean_ap, "AP": [float(a) for a in aps]}

    def validate(self, model_output_shape: Sequence[int], target_shape: Sequence[int]) -> None:
        """Kept for VISSL compatibility; checks happen in :meth:`update`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_classes={self.num_classes}, samples={self.num_samples})"
