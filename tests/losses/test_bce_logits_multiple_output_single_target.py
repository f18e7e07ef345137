"""bce_logits_multiple_output_single_target against the formula written out element by element."""

from __future__ import annotations

import math

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss


def _bce(x: float, t: int) -> float:
    p = 1.0 / (1.0 + math.exp(-x))
    return -(t * math.log(p) + (1 - t) * math.log(1 - p))


def _reference(output: torch.Tensor, target: torch.Tensor, reduction: str) -> float:
    """Per entry BCE, the -1 entries left out; none: each class averaged over its valid
    samples, then summed over classes."""
    b, c = output.shape
    per_class = []
    valid_terms = []
    for j in range(c):
        terms = [
            _bce(float(output[i, j]), int(target[i, j])) for i in range(b) if target[i, j] != -1
        ]
        valid_terms += terms
        per_class.append(sum(terms) / max(len(terms), 1))
    if reduction == "none":
        return sum(per_class)
    if reduction == "sum":
        return sum(valid_terms)
    return sum(valid_terms) / max(len(valid_terms), 1)


def _loss(**params: object) -> torch.nn.Module:
    name = "bce_logits_multiple_output_single_target"
    return build_loss(AttrDict(name=name, **{name: params}))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_against_the_formula(reduction: str) -> None:
    torch.manual_seed(0)
    outputs = [torch.randn(6, 4, dtype=torch.float64) for _ in range(2)]
    target = torch.randint(-1, 2, (6, 4))
    target[:, 3] = -1  # a class with no valid sample contributes 0
    loss = _loss(reduction=reduction, world_size=8)(outputs, target)
    expected = sum(_reference(o, target, reduction) for o in outputs)
    assert loss.item() == pytest.approx(expected, rel=1e-10)


def test_ignored_entries_get_no_gradient_and_normalize_output() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 3, requires_grad=True)
    target = torch.tensor([[1, 0, -1]] * 5)
    _loss()(x, target).backward()
    assert x.grad is not None
    assert torch.all(x.grad[:, 2] == 0) and torch.all(x.grad[:, :2] != 0)
    normalized = _loss(normalize_output=True)(x.detach(), target)
    expected = _reference(torch.nn.functional.normalize(x.detach(), dim=1), target, "none")
    assert normalized.item() == pytest.approx(expected, rel=1e-5)


def test_errors() -> None:
    with pytest.raises(ConfigError, match=r"bce_logits_multiple_output_single_target\.reduction"):
        _loss(reduction="avg")
    with pytest.raises(ValueError, match="like the target"):
        _loss()(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


def test_typed_params_refuse_unknown_keys_and_bad_values() -> None:
    from vissl.errors import ConfigError, UnknownKeyError
    from vissl.losses.bce_logits_multiple_output_single_target import (
        BCELogitsMultipleOutputSingleTargetLoss as Loss,
    )

    key = "config.LOSS.bce_logits_multiple_output_single_target"
    assert Loss.from_config({}).reduction == "none"
    with pytest.raises(UnknownKeyError) as err:
        Loss.from_config({"reductoin": "sum"})
    assert err.value.key_path == f"{key}.reductoin" and "reduction" in str(err.value)
    for bad in ({"reduction": "avg"}, {"normalize_output": 1}, {"world_size": "2"}):
        with pytest.raises(ConfigError) as err:
            Loss.from_config(bad)
        assert err.value.key_path == f"{key}.{next(iter(bad))}"
