"""cross_entropy_multiple_output_single_target and build_loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.losses import LOSS_REGISTRY, build_loss, get_loss


def _ce_cfg(**params: object) -> AttrDict:
    base = {
        "weight": None,
        "reduction": "mean",
        "ignore_index": -1,
        "normalize_output": False,
        "temperature": 1.0,
    }
    base.update(params)
    return AttrDict(
        name="cross_entropy_multiple_output_single_target",
        cross_entropy_multiple_output_single_target=base,
    )


def test_single_output_is_cross_entropy() -> None:
    torch.manual_seed(0)
    out, target = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 1, -1])
    loss = build_loss(_ce_cfg())
    assert torch.allclose(loss(out, target), F.cross_entropy(out, target, ignore_index=-1))


def test_list_of_outputs_is_summed_with_temperature_and_normalisation() -> None:
    torch.manual_seed(1)
    outs = [torch.randn(5, 3), torch.randn(5, 3)]
    target = torch.tensor([0, 2, 1, 1, 0])
    loss = build_loss(_ce_cfg(temperature=0.5, normalize_output=True))
    expected = sum(F.cross_entropy(F.normalize(o, dim=1) / 0.5, target) for o in outs)
    assert torch.allclose(loss(outs, target), expected)


def test_soft_targets_and_reductions() -> None:
    torch.manual_seed(2)
    out = torch.randn(4, 3)
    soft = torch.softmax(torch.randn(4, 3), dim=1)
    per_sample = -(F.log_softmax(out, dim=1) * soft).sum(dim=1)
    assert torch.allclose(build_loss(_ce_cfg())(out, soft), per_sample.mean())
    assert torch.allclose(build_loss(_ce_cfg(reduction="sum"))(out, soft), per_sample.sum())
    assert torch.allclose(build_loss(_ce_cfg(reduction="none"))([out, out], soft), 2 * per_sample)


def test_class_weights_from_a_list() -> None:
    torch.manual_seed(3)
    out, target = torch.randn(6, 3), torch.tensor([0, 1, 2, 2, 1, 0])
    loss = build_loss(_ce_cfg(weight=[1.0, 2.0, 0.5]))
    expected = F.cross_entropy(out, target, weight=torch.tensor([1.0, 2.0, 0.5]))
    assert torch.allclose(loss(out, target), expected)


def test_gradients_flow() -> None:
    out = torch.randn(3, 4, requires_grad=True)
    build_loss(_ce_cfg())([out, out * 2], torch.tensor([0, 1, 3])).backward()
    assert out.grad is not None and out.grad.abs().sum() > 0


def test_bad_reduction_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        build_loss(_ce_cfg(reduction="avg"))
    assert info.value.key_path == (
        "config.LOSS.cross_entropy_multiple_output_single_target.reduction"
    )


def test_torch_loss_fallback_with_kwargs() -> None:
    loss = build_loss(AttrDict(name="CrossEntropyLoss", CrossEntropyLoss={"ignore_index": -1}))
    assert isinstance(loss, torch.nn.CrossEntropyLoss) and loss.ignore_index == -1
    mse = build_loss(AttrDict(name="MSELoss"))  # no parameter block
    assert isinstance(mse, torch.nn.MSELoss)
    weighted = build_loss(
        AttrDict(name="BCEWithLogitsLoss", BCEWithLogitsLoss={"pos_weight": [2.0]})
    )
    assert torch.equal(weighted.pos_weight, torch.tensor([2.0]))
    assert get_loss("L1Loss") is torch.nn.L1Loss
    assert "L1Loss" not in LOSS_REGISTRY  # resolved, not registered


def test_torch_loss_bad_kwarg_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        build_loss(AttrDict(name="MSELoss", MSELoss={"temperature": 2}))
    assert info.value.key_path == "config.LOSS.MSELoss.temperature"


def test_unknown_loss_lists_names_and_mentions_torch() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_loss(AttrDict(name="simclr_info_nce"))
    message = str(info.value)
    assert "simclr_info_nce_loss" in message and "config.LOSS.name" in message
    assert "torch.nn" in message
    with pytest.raises(ConfigError, match=r"config\.LOSS\.name"):
        build_loss(AttrDict(name=""))
