"""accuracy / precision@k / recall@k list meters: values, formats, sync, no host reads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.meters import build_meters
from vissl.meters.accuracy_list_meter import AccuracyListMeter
from vissl.meters.precision_at_k_list_meter import PrecisionAtKListMeter
from vissl.meters.recall_at_k_list_meter import RecallAtKListMeter
from vissl.utils.test_utils import spawn_gloo

# 4 samples, 5 classes. Ranked classes per row (best first):
#   row0: 1, 3, 4, 0, 2   row1: 0, 2, 1, 3, 4   row2: 4, 3, 2, 1, 0   row3: 2, 0, 1, 4, 3
SCORES = torch.tensor(
    [
        [0.06, 0.41, 0.04, 0.39, 0.10],
        [0.50, 0.20, 0.25, 0.03, 0.02],
        [0.00, 0.10, 0.20, 0.30, 0.40],
        [0.30, 0.15, 0.50, 0.00, 0.05],
    ]
)
TARGET = torch.tensor([3, 0, 0, 1])


def _cfg(name: str, **params: object) -> AttrDict:
    return AttrDict(names=[name], **{name: params})


def test_accuracy_against_hand_computed_topk() -> None:
    meter = build_meters(
        _cfg("accuracy_list_meter", num_meters=1, topk_values=[1, 2, 3], meter_names=[])
    )[0]
    meter.update(SCORES, TARGET)
    # top1 hits: row1 only; top2 adds row0 (3 is 2nd); top3 adds row3 (1 is 3rd).
    assert meter.value == {"top_1": {0: 25.0}, "top_2": {0: 50.0}, "top_3": {0: 75.0}}
    assert meter.name == "accuracy_list_meter"


def test_accuracy_accumulates_and_resets() -> None:
    meter = AccuracyListMeter(num_meters=1, topk_values=[1])
    meter.update(SCORES, TARGET)
    meter.update(SCORES[1:2], TARGET[1:2])
    assert meter.value["top_1"][0] == pytest.approx(100 * round(2 / 5, 6))
    meter.reset()
    assert meter.value == {"top_1": {0: 0.0}}


def test_multiple_outputs_named_and_shared_names() -> None:
    meter = AccuracyListMeter(num_meters=3, topk_values=[1], meter_names=["res4", "res5", "res5"])
    perfect = torch.nn.functional.one_hot(TARGET, 5).float()
    meter.update([SCORES, perfect, SCORES], TARGET)
    assert meter.value == {"top_1": {"res4": 25.0, "res5": [100.0, 25.0]}}
    indexed = AccuracyListMeter(num_meters=2, topk_values=[1, 5])
    indexed.update([SCORES, perfect], TARGET)
    assert indexed.value == {"top_1": {0: 25.0, 1: 100.0}, "top_5": {0: 100.0, 1: 100.0}}


def test_accuracy_with_one_hot_targets() -> None:
    meter = AccuracyListMeter(topk_values=[1, 2])
    meter.update(SCORES, torch.nn.functional.one_hot(TARGET, 5))
    assert meter.value == {"top_1": {0: 25.0}, "top_2": {0: 50.0}}


def test_precision_and_recall_multilabel() -> None:
    # VISSL's docstring example: targets [0 1 0 1 0], scores row 0.
    scores = SCORES[:1]
    target = torch.tensor([[0, 1, 0, 1, 0]])
    precision = PrecisionAtKListMeter(topk_values=[1, 3])
    recall = RecallAtKListMeter(topk_values=[1, 3])
    precision.update(scores, target)
    recall.update(scores, target)
    assert precision.value == {"top_1": {0: 100.0}, "top_3": {0: 100 * round(2 / 3, 6)}}
    assert recall.value == {"top_1": {0: 50.0}, "top_3": {0: 100.0}}


def test_precision_and_recall_single_label_indices() -> None:
    precision = PrecisionAtKListMeter(topk_values=[1, 2])
    recall = RecallAtKListMeter(topk_values=[1, 2])
    precision.update(SCORES, TARGET)
    recall.update(SCORES, TARGET)
    # hits@1 = 1, hits@2 = 2 over 4 samples with one label each.
    assert precision.value == {"top_1": {0: 25.0}, "top_2": {0: 100 * round(2 / 8, 6)}}
    assert recall.value == {"top_1": {0: 25.0}, "top_2": {0: 50.0}}


def test_state_dict_round_trip() -> None:
    meter = AccuracyListMeter(topk_values=[1, 2])
    meter.update(SCORES, TARGET)
    meter.sync_state()
    meter.update(SCORES[:1], TARGET[:1])
    state = meter.state_dict()
    other = AccuracyListMeter(topk_values=[1, 2])
    other.load_state_dict(state)
    assert other.value == meter.value
    with pytest.raises(ValueError):
        PrecisionAtKListMeter(topk_values=[1, 2]).load_state_dict(state)


@contextlib.contextmanager
def _no_host_reads() -> Iterator[None]:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("host read during update")

    names = ["item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"]
    saved = {n: getattr(torch.Tensor, n) for n in names}
    try:
        for n in names:
            setattr(torch.Tensor, n, boom)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


@pytest.mark.parametrize("cls", [AccuracyListMeter, PrecisionAtKListMeter, RecallAtKListMeter])
def test_update_does_not_read_back_to_host(cls: type) -> None:
    meter = cls(num_meters=2, topk_values=[1, 2])
    one_hot = torch.nn.functional.one_hot(TARGET, 5)
    with _no_host_reads():
        meter.update([SCORES, SCORES], TARGET)
        meter.update([SCORES, SCORES], one_hot)
    with _no_host_reads(), pytest.raises(AssertionError):
        torch.ones(1).item()  # the patch is effective
    assert meter.value["top_1"][0] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_does_not_synchronise_cuda() -> None:
    meters = [
        cls(num_meters=1, topk_values=[1, 2])
        for cls in (AccuracyListMeter, PrecisionAtKListMeter, RecallAtKListMeter)
    ]
    scores, target = SCORES.cuda(), TARGET.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for meter in meters:
            meter.update(scores, target)
            meter.update(scores, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert meters[0].value == {"top_1": {0: 25.0}, "top_2": {0: 50.0}}


def test_build_meters_empty_and_deprecated_name() -> None:
    assert build_meters(None) == []
    assert build_meters(AttrDict()) == []
    assert build_meters(AttrDict(names=[], name="")) == []
    with pytest.warns(DeprecationWarning):
        meters = build_meters(AttrDict(names=[], name="accuracy_list_meter"))
    assert [m.name for m in meters] == ["accuracy_list_meter"]
    both = build_meters(
        AttrDict(
            names=["accuracy_list_meter", "recall_at_k_list_meter"],
            accuracy_list_meter={"num_meters": 2, "topk_values": [1, 5], "meter_names": []},
        )
    )
    assert [type(m) for m in both] == [AccuracyListMeter, RecallAtKListMeter]
    assert both[0].num_meters == 2 and both[0].topk_values == [1, 5]


def test_meter_errors_name_keys() -> None:
    with pytest.raises(UnknownNameError, match="accuracy_list_meter"):
        build_meters(AttrDict(names=["accuracy_meter_list"]))
    with pytest.raises(ConfigError) as info:
        build_meters(_cfg("accuracy_list_meter", topk_values=[0]))
    assert info.value.key_path == "config.METERS.accuracy_list_meter.topk_values"
    meter = AccuracyListMeter(num_meters=2)
    with pytest.raises(ConfigError, match="num_meters"):
        meter.update(SCORES, TARGET)
    with pytest.raises(ConfigError, match="topk_values"):
        AccuracyListMeter(topk_values=[10]).update(SCORES, TARGET)


def _sync_worker(rank: int, world_size: int) -> dict:
    meter = AccuracyListMeter(topk_values=[1, 2])
    # rank 0 sees rows 0-1, rank 1 rows 2-3.
    meter.update(SCORES[2 * rank : 2 * rank + 2], TARGET[2 * rank : 2 * rank + 2])
    local = meter.value
    meter.sync_state()
    synced = meter.value
    meter.sync_state()  # nothing new: totals unchanged
    return {"local": local, "synced": synced, "again": meter.value}


def test_sync_state_across_two_processes() -> None:
    results = spawn_gloo(_sync_worker, 2)
    assert results[0]["local"] == {"top_1": {0: 50.0}, "top_2": {0: 100.0}}
    assert results[1]["local"] == {"top_1": {0: 0.0}, "top_2": {0: 0.0}}
    for r in results:
        assert r["synced"] == {"top_1": {0: 25.0}, "top_2": {0: 50.0}}
        assert r["again"] == r["synced"]
