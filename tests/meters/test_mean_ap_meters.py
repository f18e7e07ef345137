"""mean_ap_meter / mean_ap_list_meter: AP against scikit-learn, ignored targets, padding,
2 gloo processes vs 1, checkpoint state and user errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, precision_recall_curve

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.meters import build_meters
from vissl.meters.mean_ap_list_meter import MeanAPListMeter
from vissl.meters.mean_ap_meter import MeanAPMeter
from vissl.utils.test_utils import spawn_gloo

N, C = 41, 5


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (continuous: no ties) and VOC-style targets; class 4 has no positive."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, C, generator=g) * 2
    targets = torch.randint(0, 2, (N, C), generator=g)
    targets[torch.rand(N, C, generator=g) < 0.2] = -1  # "difficult": ignored
    targets[:, 4] = torch.where(targets[:, 4] == 1, 0, targets[:, 4])
    targets[0, :4] = 1  # every other class has a positive
    # the classifier is informative, so that ignoring the -1 rows changes the APs
    logits = logits + 1.5 * (targets == 1)
    return logits, targets


def _sklearn_interpolated_ap(y: np.ndarray, s: np.ndarray) -> float:
    """Area under the interpolated precision-recall curve (precision made non-increasing in
    recall), the VOC 2010+ AP, from scikit-learn's curve."""
    precision, recall, _ = precision_recall_curve(y, s)
    # precision_recall_curve runs from recall 1 down to recall 0
    interpolated = np.maximum.accumulate(precision)
    return float(np.sum((recall[:-1] - recall[1:]) * interpolated[:-1]))


def _expected(scores: torch.Tensor, targets: torch.Tensor) -> tuple[float, list[float]]:
    s, t = scores.double().numpy(), targets.numpy()
    aps = []
    for c in range(t.shape[1]):
        counted = t[:, c] != -1
        y = t[counted, c]
        aps.append(_sklearn_interpolated_ap(y, s[counted, c]) if (y == 1).any() else -1.0)
    present = [a for a in aps if a != -1.0]
    return float(np.mean(present)), aps


def test_mean_ap_matches_sklearn_per_class_ignoring_minus_one() -> None:
    logits, targets = _data()
    meter = MeanAPMeter(num_classes=C)
    for start in range(0, N, 8):  # batches accumulate
        meter.update(torch.sigmoid(logits[start : start + 8]), targets[start : start + 8])
    value = meter.value
    mean_ap, aps = _expected(torch.sigmoid(logits), targets)
    assert value["AP"] == pytest.approx(aps, abs=1e-9)
    assert value["mAP"] == pytest.approx(mean_ap, abs=1e-9)
    assert value["AP"][4] == -1.0  # no positive: excluded from the mean
    # the -1 rows are really left out: counting them as negatives changes the APs
    as_negatives = [
        _sklearn_interpolated_ap((targets[:, c] == 1).numpy(), logits[:, c].numpy())
        for c in range(4)
    ]
    assert as_negatives != pytest.approx(aps[:4], abs=1e-6)
    # and it is the interpolated AP: never below scikit-learn's step-wise AP
    for c in range(4):
        counted = targets[:, c] != -1
        step = average_precision_score(targets[counted, c], logits[counted, c])
        assert aps[c] >= step - 1e-12


def test_list_meter_sigmoid_names_percent_and_padding() -> None:
    logits, targets = _data(1)
    meter = build_meters(
        AttrDict(
            names=["mean_ap_list_meter"],
            mean_ap_list_meter={"num_classes": C, "num_meters": 2, "meter_names": ["a", "b"]},
        )
    )[0]
    assert isinstance(meter, MeanAPListMeter)
    valid = torch.ones(N, dtype=torch.long)
    valid[-5:] = 0  # padding rows repeat other samples: not counted
    garbage = targets.clone()
    garbage[-5:] = 1 - garbage[-5:].clamp(min=0)
    meter.update([logits, -logits], garbage, valid=valid)
    mean_ap, aps = _expected(logits[:-5], targets[:-5])
    value = meter.value
    assert value["mAP"]["a"] == pytest.approx(100 * round(mean_ap, 6))
    assert value["AP"]["a"] == pytest.approx(aps, abs=1e-9)
    assert value["mAP"]["b"] < value["mAP"]["a"]  # reversed scores rank worse


def test_state_dict_round_trip_and_reset() -> None:
    logits, targets = _data(2)
    meter = MeanAPListMeter(num_classes=C)
    meter.update(logits[:20], targets[:20])
    meter.sync_state()  # one process: synced rows
    meter.update(logits[20:], targets[20:])  # unsynced rows
    restored = MeanAPListMeter(num_classes=C)
    restored.load_state_dict(meter.state_dict())
    assert restored.value == meter.value
    assert restored.meters[0].num_samples == N
    meter.reset()
    assert meter.value["mAP"] == {0: 0.0} and meter.value["AP"][0] == [-1.0] * C


def test_user_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"mean_ap_list_meter\.num_classes"):
        MeanAPListMeter(num_classes=None)  # type: ignore[arg-type]
    meter = MeanAPListMeter(num_classes=3)
    with pytest.raises(ConfigError, match=r"num_classes is 3 but the model output has 5"):
        meter.update(torch.zeros(2, 5), torch.zeros(2, 5))
    with pytest.raises(ConfigError, match="num_meters is 1"):
        meter.update([torch.zeros(2, 3)] * 2, torch.zeros(2, 3))
    capped = MeanAPMeter(num_classes=3, max_cpu_capacity=3)
    capped.update(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="max_cpu_capacity=3"):
        capped.update(torch.zeros(2, 3), torch.zeros(2, 3))
    bad = MeanAPMeter(num_classes=3)
    bad.update(torch.zeros(2, 3), torch.full((2, 3), 2))
    with pytest.raises(ValueError, match="must be 1 .present., 0 .absent. or -1"):
        _ = bad.value


def _two_rank_worker(rank: int, world: int) -> dict:
    logits, targets = _data(3)
    # unequal shares (13 / 28 rows), rank 1's last row is the sampler's padding
    cut = 13
    rows = slice(0, cut) if rank == 0 else slice(cut, N)
    lg = logits[rows]
    tg = targets[rows]
    valid = torch.ones(lg.shape[0], dtype=torch.long)
    if rank == 1:
        lg = torch.cat([lg, logits[:1]])
        tg = torch.cat([tg, targets[:1]])
        valid = torch.cat([valid, torch.zeros(1, dtype=torch.long)])
    meter = MeanAPListMeter(num_classes=C)
    meter.update(lg[:5], tg[:5], valid=valid[:5])
    meter.update(lg[5:], tg[5:], valid=valid[5:])
    meter.sync_state()
    return meter.value


def test_two_gloo_processes_equal_one() -> None:
    logits, targets = _data(3)
    single = MeanAPListMeter(num_classes=C)
    single.update(logits, targets)
    single.sync_state()
    results = spawn_gloo(_two_rank_worker, 2)
    assert results[0] == results[1]
    assert results[0]["mAP"][0] == pytest.approx(single.value["mAP"][0], abs=1e-9)
    assert results[0]["AP"][0] == pytest.approx(single.value["AP"][0], abs=1e-12)
