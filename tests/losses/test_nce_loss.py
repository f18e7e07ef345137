"""``nce_loss_with_memory`` (NPID, NPID++, PIRL) against the papers' formulas written here.

NPID (Wu et al. 2018): ``P(i|v) = exp(M_i . v / T) / Z`` (eq. 4), ``Z = N * mean exp(.)``
estimated once (eq. 6), the NCE loss with noise probability ``1/N`` (eq. 7) and the
proximal update of the bank ``M_i <- normalise(m M_i + (1-m) v)``; PIRL (Misra & van der
Maaten 2020) uses the InfoNCE form. The memory of 2 gloo processes equals the memory of 1
process after the same steps.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.nce_loss import NCELossWithMemory
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.nce_loss_with_memory"
N, D, K, T = 12, 5, 4, 0.2


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True)


def _fixed_negatives(loss: NCELossWithMemory) -> None:
    """Noise entries that depend only on the row's index (no RNG): the same on any rank."""

    def scores_with_fixed_noise(v: torch.Tensor, index: torch.Tensor, _neg: torch.Tensor) -> Any:
        negatives = (
            index.unsqueeze(1) * 5 + torch.arange(1, loss.num_negatives + 1)
        ) % loss.num_items
        return NCELossWithMemory.scores(loss, v, index, negatives)

    loss.scores = scores_with_fixed_noise  # type: ignore[method-assign]


def _loss(**kwargs: Any) -> NCELossWithMemory:
    args: dict[str, Any] = dict(
        num_train_samples=N, embedding_dim=D, temperature=T, num_negatives=K, momentum=0.5
    )
    args.update(kwargs)
    return NCELossWithMemory(**args)


# ----------------------------------------------------------------------------- formulas
def ref_nce(memory, v, index, negatives, z, temperature):
    """NPID eq. 7 written out row by row, in float64."""
    total = 0.0
    n = memory.shape[0]
    k = negatives.shape[1]
    for r in range(v.shape[0]):
        p_pos = math.exp(float(memory[index[r]] @ v[r]) / temperature) / z
        total += -math.log(p_pos / (p_pos + k / n))
        for j in negatives[r]:
            p = math.exp(float(memory[j] @ v[r]) / temperature) / z
            total += -math.log((k / n) / (p + k / n))
    return total / v.shape[0]


def ref_info_nce(memory, v, index, negatives, temperature):
    total = 0.0
    for r in range(v.shape[0]):
        logits = [float(memory[index[r]] @ v[r]) / temperature]
        logits += [float(memory[j] @ v[r]) / temperature for j in negatives[r]]
        total += -(logits[0] - math.log(sum(math.exp(x) for x in logits)))
    return total / v.shape[0]


def _inputs(seed: int = 0, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(rows, D, generator=g, dtype=torch.float64)
    index = torch.randperm(N, generator=g)[:rows]
    negatives = torch.randint(0, N, (rows, K), generator=g)
    return out, index, negatives


def test_nce_with_a_given_z_is_the_papers_eq_7() -> None:
    out, index, negatives = _inputs()
    loss = _loss(norm_constant=3.5).double()
    memory = loss.memory.clone()
    loss.draw_negatives = lambda rows, device: negatives  # type: ignore[method-assign]
    value = loss(out.clone().requires_grad_(True), index)
    expected = ref_nce(memory.double(), _unit(out), index, negatives, 3.5, T)
    assert value.item() == pytest.approx(expected, rel=1e-5)


def test_z_is_estimated_once_from_the_first_batch() -> None:
    out, index, negatives = _inputs()
    loss = _loss(norm_constant=-1).double()
    memory = loss.memory.clone()
    loss.draw_negatives = lambda rows, device: negatives  # type: ignore[method-assign]
    value = loss(out, index)
    v = _unit(out)
    ids = torch.cat([index.unsqueeze(1), negatives], dim=1)
    exps = [math.exp(float(memory[j] @ v[r]) / T) for r in range(6) for j in ids[r]]
    z = N * sum(exps) / len(exps)
    assert loss.norm_constant.item() == pytest.approx(z, rel=1e-6)
    assert value.item() == pytest.approx(ref_nce(memory, v, index, negatives, z, T), rel=1e-5)
    # the second step keeps that Z
    loss(torch.randn(6, D, dtype=torch.float64), index)
    assert loss.norm_constant.item() == pytest.approx(z, rel=1e-6)


def test_cross_entropy_is_info_nce_over_the_positive_and_the_noise() -> None:
    out, index, negatives = _inputs(1)
    loss = _loss(loss_type="cross_entropy").double()
    memory = loss.memory.clone()
    loss.draw_negatives = lambda rows, device: negatives  # type: ignore[method-assign]
    value = loss(out, index)
    assert value.item() == pytest.approx(
        ref_info_nce(memory, _unit(out), index, negatives, T), rel=1e-6
    )


def test_the_bank_update_is_the_proximal_momentum_update() -> None:
    out, index, _ = _inputs(2)
    loss = _loss(momentum=0.3).double()
    before = loss.memory.clone()
    loss(out, index)
    v = _unit(out)
    expected = before.clone()
    for r in range(6):
        row = 0.3 * before[index[r]] + 0.7 * v[r]
        expected[index[r]] = row / row.norm()
    torch.testing.assert_close(loss.memory, expected)


def test_the_gradient_flows_to_the_embeddings_not_the_bank() -> None:
    out, index, _ = _inputs(3)
    out = out.float().requires_grad_(True)
    loss = _loss()
    loss(out, index).backward()
    assert out.grad is not None and out.grad.abs().sum() > 0
    assert not loss.memory.requires_grad


def test_two_outputs_are_weighted_and_only_the_chosen_one_updates_the_bank() -> None:
    out_a, index, negatives = _inputs(4)
    out_b = torch.randn_like(out_a)
    loss = _loss(loss_type="cross_entropy", loss_weights=[0.25, 0.75], update_mem_with_emb_index=1)
    loss = loss.double()
    memory = loss.memory.clone()
    loss.draw_negatives = lambda rows, device: negatives  # type: ignore[method-assign]
    value = loss([out_a, out_b], index)
    # both outputs are scored against the bank as it was before the step
    expected = 0.25 * ref_info_nce(memory, _unit(out_a), index, negatives, T) + 0.75 * (
        ref_info_nce(memory, _unit(out_b), index, negatives, T)
    )
    assert value.item() == pytest.approx(expected, rel=1e-6)
    row = 0.5 * memory[index[0]] + 0.5 * _unit(out_b)[0]
    torch.testing.assert_close(loss.memory[index[0]], row / row.norm())


def test_ignored_rows_and_repeated_indices() -> None:
    loss = _loss(loss_type="cross_entropy").double()
    before = loss.memory.clone()
    out = torch.randn(4, D, dtype=torch.float64)
    index = torch.tensor([3, -1, 3, 0])
    value = loss(out, index)
    assert torch.isfinite(value)
    v = _unit(out)
    first = 0.5 * before[3] + 0.5 * v[0]
    torch.testing.assert_close(loss.memory[3], first / first.norm())  # the first row of 3
    zero = 0.5 * before[0] + 0.5 * v[3]
    torch.testing.assert_close(loss.memory[0], zero / zero.norm())  # not the ignored row
    untouched = [i for i in range(N) if i not in (0, 3)]
    torch.testing.assert_close(loss.memory[untouched], before[untouched])


def test_an_all_ignored_batch_has_zero_loss_and_leaves_the_bank() -> None:
    loss = _loss(loss_type="cross_entropy")
    before = loss.memory.clone()
    value = loss(torch.randn(3, D), torch.full((3,), -1))
    assert value.item() == 0.0
    torch.testing.assert_close(loss.memory, before)


def test_the_bank_and_z_are_saved_and_restored_exactly() -> None:
    out, index, _ = _inputs(5)
    loss = _loss()
    loss(out.float(), index)
    state = loss.state_dict()
    assert set(state) == {"memory", "norm_constant"}
    fresh = _loss()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.memory, loss.memory, rtol=0, atol=0)
    assert fresh.norm_constant.item() == loss.norm_constant.item() > 0
    fresh(out.float(), index)  # Z known from the checkpoint: not estimated again
    assert fresh.norm_constant.item() == loss.norm_constant.item()


# ----------------------------------------------------------------------------- ranks
WORLD = 2
ROWS = 4  # per rank


def _global(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(WORLD * ROWS, D, generator=g), torch.randperm(N, generator=g)[: WORLD * ROWS]


def _run_steps(rank: int, world: int) -> dict[str, Any]:
    loss = _loss(norm_constant=-1)
    _fixed_negatives(loss)
    values = []
    for step in range(3):
        out, index = _global(step)
        rows = slice(rank * ROWS, (rank + 1) * ROWS) if world > 1 else slice(None)
        values.append(loss(out[rows], index[rows]).item())
    return {"memory": loss.memory.clone(), "z": loss.norm_constant.item(), "losses": values}


def test_two_processes_keep_the_same_bank_as_one_process_on_the_global_batch() -> None:
    one = _run_steps(0, 1)
    results = spawn_gloo(_run_steps, WORLD)
    for r in results:
        torch.testing.assert_close(r["memory"], one["memory"], rtol=0, atol=0)
        assert r["z"] == pytest.approx(one["z"], rel=1e-6)
    # each rank's loss is the mean over its rows: their mean is the global batch's loss
    for step in range(3):
        mean = sum(r["losses"][step] for r in results) / WORLD
        assert mean == pytest.approx(one["losses"][step], rel=1e-5)


# ----------------------------------------------------------------------------- config
def _config(*overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_npid", *overrides])
    return cfg


def test_quick_config_builds_with_the_data_sets_size() -> None:
    cfg = _config()
    cfg.LOSS.nce_loss_with_memory.num_train_samples = 24  # what the task sets
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, NCELossWithMemory)
    assert tuple(loss.memory.shape) == (24, 32)
    assert (loss.num_negatives, loss.loss_type, loss.momentum) == (16, "nce", 0.5)
    torch.testing.assert_close(loss.memory.norm(dim=1), torch.ones(24))


def test_without_the_data_sets_size_the_error_says_what_to_set() -> None:
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="nce_loss_with_memory", nce_loss_with_memory={}))
    assert err.value.key_path == f"{KEY}.num_train_samples"


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"temperature": 0}, "temperature"),
        ({"loss_type": "hinge"}, "loss_type"),
        (
            {"negative_sampling_params": {"num_negatives": 0}},
            "negative_sampling_params.num_negatives",
        ),
        ({"negative_sampling_params": {"type": "hard"}}, "negative_sampling_params.type"),
        ({"memory_params": {"momentum": 1.0}}, "memory_params.momentum"),
        ({"memory_params": {"embedding_dim": 0}}, "memory_params.embedding_dim"),
        ({"norm_constant": 0}, "norm_constant"),
        ({"loss_weights": [1.0, -1.0]}, "loss_weights[1]"),
        ({"memory_params": 3}, "memory_params"),
    ],
)
def test_bad_values_name_their_key(params: dict[str, Any], key: str) -> None:
    block = {"num_train_samples": 10, **params}
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="nce_loss_with_memory", nce_loss_with_memory=block))
    assert err.value.key_path == f"{KEY}.{key}"


def test_mismatched_outputs_are_explained() -> None:
    loss = _loss(loss_weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match="loss_weights has 2 entries"):
        loss(torch.randn(2, D), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="embedding_dim"):
        _loss()(torch.randn(2, D + 1), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="sample_index"):
        _loss()(torch.randn(2, D), torch.tensor([0, 1, 2]))


def test_the_task_sets_num_train_samples_from_the_data(tmp_path) -> None:
    from vissl.trainer.task import SelfSupervisionTask

    cfg = _config(f"config.CHECKPOINT.DIR={tmp_path}")
    given = cfg.to_dict()
    task = SelfSupervisionTask(cfg, str(tmp_path), torch.device("cpu"), ()).build()
    assert isinstance(task.loss, NCELossWithMemory)
    assert task.loss.num_items == 24 == len(task.datasets["TRAIN"])
    # built from a copy: the validated (and saved) config is not written into
    assert task.config.to_dict() == given


def test_a_bf16_autocast_still_scores_in_fp32() -> None:
    out, index, negatives = _inputs(6)
    out = out.float()
    plain, mixed = _loss(norm_constant=2.0), _loss(norm_constant=2.0)
    for loss in (plain, mixed):
        loss.draw_negatives = lambda rows, device: negatives  # type: ignore[method-assign]
    expected = plain(out, index)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = mixed(out.bfloat16(), index)
    assert got.dtype == torch.float32
    # only the bf16 rounding of the inputs differs, not bf16 arithmetic on exp(s / T)
    assert got.item() == pytest.approx(expected.item(), rel=2e-2)
    start = _loss().memory.double()  # the bank before the step (a fixed draw)
    ref = ref_nce(start, _unit(out.bfloat16().double()), index, negatives, 2.0, T)
    assert got.item() == pytest.approx(ref, rel=1e-4)
