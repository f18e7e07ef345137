"""TEST phases on 2 ranks: the ``DistributedSampler``'s padding is not counted by meters.

359 samples on 2 ranks: the sampler repeats one sample so that both ranks get 180. The
repeat is marked ``data_valid`` 0 and the standard step's ``update_meters`` leaves it out,
so the synced meters count exactly 359 samples.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
import yaml

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.data import build_dataset, get_loader
from vissl.data.samplers import StatefulDistributedSampler
from vissl.meters import METER_REGISTRY, build_meters, register_meter
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep
from vissl.utils.test_utils import spawn_gloo

NUM_SAMPLES = 359
_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    with open(_DEFAULTS) as f:
        return yaml.safe_load(f)["config"]  # type: ignore[no-any-return]


class RowCounter:
    """A VISSL-style meter without ``valid=`` support: counts the rows it is given."""

    def __init__(self) -> None:
        self.rows = 0

    def update(self, model_output: torch.Tensor, target: torch.Tensor) -> None:
        self.rows += int(target.shape[0])


if "_test_row_counter" not in METER_REGISTRY:
    register_meter("_test_row_counter")(RowCounter)


def _cfg() -> AttrDict:
    raw = copy.deepcopy(_defaults())
    raw["DATA"]["NUM_DATALOADER_WORKERS"] = 0
    raw["DATA"]["TEST"].update(
        DATA_SOURCES=["digits"],
        DATA_LIMIT=NUM_SAMPLES,
        BATCHSIZE_PER_REPLICA=64,
        TRANSFORMS=[{"name": "ToTensor"}],
    )
    raw["METERS"].update(
        names=["accuracy_list_meter", "precision_at_k_list_meter", "_test_row_counter"]
    )
    return AttrDict(raw)


def _predictions(target: torch.Tensor, data_idx: torch.Tensor) -> torch.Tensor:
    """Right for even sample indices, wrong for odd ones."""
    predicted = torch.where(data_idx % 2 == 0, target, (target + 1) % 10)
    return F.one_hot(predicted, 10).float()


def _test_phase(rank: int, world_size: int) -> Any:
    cfg = _cfg()
    loader = get_loader(
        build_dataset(cfg, "TEST"),
        cfg,
        "TEST",
        num_replicas=world_size,
        rank=rank,
        seed=0,
        device_is_cuda=False,
    )
    meters = build_meters(cfg.METERS, device=torch.device("cpu"))
    task = SimpleNamespace(meters=meters, train=False, enable_training_meter=True)
    step = StandardTrainStep()
    seen = 0
    for batch in loader:
        target, idx = batch["label"][0], batch["data_idx"][0]
        sample = {"target": target, "data_valid": batch["data_valid"][0]}
        step.update_meters(task, _predictions(target, idx), sample)
        seen += int(target.shape[0])
    accuracy, precision, rows = meters
    accuracy.sync_state()
    precision.sync_state()
    return {
        "seen": seen,
        "accuracy_count": float(accuracy._total_denom[0]),
        "accuracy": accuracy.value["top_1"][0],
        "precision_count": float(precision._total_denom[0]),
        "rows": rows.rows,
    }


def test_padding_is_not_counted_in_test_meters() -> None:
    results = spawn_gloo(_test_phase, 2)
    assert [r["seen"] for r in results] == [180, 180]  # one padding repeat in all
    for r in results:
        assert r["accuracy_count"] == NUM_SAMPLES
        assert r["precision_count"] == NUM_SAMPLES
        # 180 of the 359 indices (0, 2, ..., 358) are even
        assert abs(r["accuracy"] - 100.0 * round(180 / NUM_SAMPLES, 6)) < 1e-9
    assert sum(r["rows"] for r in results) == NUM_SAMPLES


def test_sampler_marks_only_the_padding() -> None:
    data = list(range(NUM_SAMPLES))
    keys = [
        list(StatefulDistributedSampler(data, 2, rank, shuffle=True, seed=3, batch_size=8))
        for rank in range(2)
    ]
    padded = [k for shard in keys for k in shard if k.padding]
    assert len(padded) == 1 and padded[0] in keys[1]
    real = sorted(k.idx for shard in keys for k in shard if not k.padding)
    assert real == data
    # A mid-epoch start keeps the flags of the remaining samples.
    sampler = StatefulDistributedSampler(data, 2, 1, shuffle=True, seed=3, batch_size=8)
    sampler.set_start_iter(22)
    assert list(sampler) == keys[1][22 * 8 :]


def test_list_meter_valid_mask() -> None:
    (meter,) = build_meters(AttrDict(names=["recall_at_k_list_meter"]))
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    meter.update(scores, torch.tensor([0, 0, 0]), valid=torch.tensor([1, 1, 0]))
    assert float(meter._curr_denom[0]) == 2.0
    assert meter.value["top_1"][0] == 50.0
