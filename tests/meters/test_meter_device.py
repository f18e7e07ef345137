"""Meters keep their state on the task's device (NCCL all-reduces only GPU tensors)."""

from __future__ import annotations

from typing import Any

import torch

from vissl.config.attr_dict import AttrDict
from vissl.meters import METER_REGISTRY, build_meters, register_meter
from vissl.meters.accuracy_list_meter import AccuracyListMeter
from vissl.utils.test_utils import spawn_gloo

_NAMES = ["accuracy_list_meter", "precision_at_k_list_meter", "recall_at_k_list_meter"]
_STATE = ("_curr_hits", "_total_hits", "_curr_denom", "_total_denom")


def _cfg() -> AttrDict:
    return AttrDict(names=list(_NAMES), **{n: {"topk_values": [1, 2]} for n in _NAMES})


def _devices(meter: Any) -> set[torch.device]:
    return {getattr(meter, attr).device for attr in _STATE}


def test_meters_are_built_on_the_given_device_and_stay_there() -> None:
    # "meta" stands in for a GPU: any state created on the CPU would show here.
    meta = torch.device("meta")
    meters = build_meters(_cfg(), device=meta)
    assert len(meters) == 3
    cpu_state = AccuracyListMeter(topk_values=[1, 2]).state_dict()
    for meter in meters:
        assert meter.device == meta
        assert _devices(meter) == {meta}
        meter.reset()
        assert _devices(meter) == {meta}
    meters[0].load_state_dict(cpu_state)  # a checkpoint's CPU state goes to the device
    assert _devices(meters[0]) == {meta}


def test_default_device_is_cpu() -> None:
    (meter,) = build_meters(AttrDict(names=["accuracy_list_meter"]))
    assert _devices(meter) == {torch.device("cpu")}


class _NoDeviceMeter:
    """A VISSL-style meter without a device argument still builds."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale


def test_meters_without_a_device_argument_still_build() -> None:
    name = "_test_no_device_meter"
    if name not in METER_REGISTRY:
        register_meter(name)(_NoDeviceMeter)
    (meter,) = build_meters(AttrDict(names=[name], **{name: {"scale": 3}}), device="meta")
    assert isinstance(meter, _NoDeviceMeter) and meter.scale == 3


def _sync_never_updated(rank: int, world_size: int) -> Any:
    # Rank 0 sees a batch, rank 1 none: rank 1's state must still be on the meters'
    # device for the collective (with NCCL: the GPU).
    (meter,) = build_meters(
        AttrDict(names=["accuracy_list_meter"], accuracy_list_meter={"topk_values": [1]}),
        device=torch.device("cpu"),
    )
    if rank == 0:
        meter.update(torch.eye(3), torch.tensor([0, 1, 0]))
    devices = _devices(meter)
    meter.sync_state()
    return devices, meter.value, float(meter._total_denom[0])


def test_sync_state_of_a_never_updated_meter() -> None:
    for devices, value, denom in spawn_gloo(_sync_never_updated, 2):
        assert devices == {torch.device("cpu")}
        assert denom == 3.0
        assert abs(value["top_1"][0] - 100.0 * 2 / 3) < 1e-3
