"""MoCo v2 loss: the paper's formula, the queue across ranks, shuffle BN, config checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.hooks.moco_hooks import MoCoHook, shuffle_across_ranks, unshuffle_across_ranks
from vissl.losses import build_loss
from vissl.losses.moco_loss import MoCoLoss
from vissl.models.momentum import TeacherStep
from vissl.utils.test_utils import spawn_gloo


def naive_moco(
    queries: torch.Tensor, keys: torch.Tensor, queue: torch.Tensor, temperature: float
) -> float:
    """InfoNCE with loops (MoCo, eq. 1): -log exp(q.k+/T) / sum over k+ and the queue."""
    total = 0.0
    for q, k in zip(queries.double(), keys.double(), strict=True):
        q = q / q.norm()
        positive = math.exp(float(q @ k) / temperature)
        negatives = sum(math.exp(float(q @ n) / temperature) for n in queue.double())
        total += -math.log(positive / (positive + negatives))
    return total / queries.shape[0]


def _loss(queue_size: int = 12, dim: int = 8, **kwargs: object) -> MoCoLoss:
    params = {"embedding_dim": dim, "queue_size": queue_size, "temperature": 0.2} | kwargs
    loss = build_loss(AttrDict(name="moco_loss", moco_loss=params))
    assert isinstance(loss, MoCoLoss)
    return loss


def _normalized(*shape: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape), dim=1)


def test_matches_the_formula() -> None:
    torch.manual_seed(0)
    loss = _loss()
    queries, keys = torch.randn(5, 8), _normalized(5, 8)
    queue = loss.queue.clone()
    got = loss(queries, None, teacher_output=keys)
    assert got.item() == pytest.approx(naive_moco(queries, keys, queue, 0.2), rel=1e-5)


def test_gradient_flows_to_the_queries_only() -> None:
    torch.manual_seed(1)
    loss = _loss()
    queries = torch.randn(4, 8, requires_grad=True)
    loss(queries, None, teacher_output=_normalized(4, 8)).backward()
    assert queries.grad is not None and queries.grad.abs().sum() > 0
    assert not loss.queue.requires_grad


def test_queue_holds_the_last_keys_in_order_on_one_process() -> None:
    torch.manual_seed(2)
    loss = _loss(queue_size=12)
    batches = [_normalized(4, 8) for _ in range(5)]
    for keys in batches:
        loss(torch.randn(4, 8), None, teacher_output=keys)
    # 5 batches of 4 into 12 slots: slots hold batches 3, 4 (wrapped) and 2.
    expected = torch.cat([batches[3], batches[4], batches[2]])
    assert torch.equal(loss.queue, expected)
    assert int(loss.queue_ptr) == (5 * 4) % 12


def test_no_enqueue_outside_training() -> None:
    loss = _loss()
    before = loss.queue.clone()
    loss(torch.randn(4, 8), None, teacher_output=_normalized(4, 8), enqueue=False)
    assert torch.equal(loss.queue, before)


def test_missing_keys_and_wrong_width_are_explained() -> None:
    loss = _loss()
    with pytest.raises(TypeError, match="teacher_output="):
        loss(torch.randn(4, 8), None)
    with pytest.raises(KeyError, match="data_momentum"):
        loss.teacher_loss_inputs({"input": torch.randn(4, 8)}, TeacherStep())
    with pytest.raises(ConfigError, match="embedding_dim"):
        loss(torch.randn(4, 6), None, teacher_output=_normalized(4, 6))


def _queue_worker(rank: int, world_size: int) -> tuple[torch.Tensor, int, list[torch.Tensor]]:
    torch.manual_seed(100 + rank)  # each rank's own initial queue: the task broadcasts it
    loss = _loss(queue_size=16)
    all_keys = []
    for step in range(5):
        g = torch.Generator().manual_seed(1000 * step)
        global_keys = torch.nn.functional.normalize(torch.randn(world_size * 2, 8, generator=g))
        all_keys.append(global_keys)
        loss(torch.randn(2, 8), None, teacher_output=global_keys[2 * rank : 2 * rank + 2])
    return loss.queue.clone(), int(loss.queue_ptr), all_keys


def test_queue_after_k_steps_holds_the_last_global_keys_in_rank_order() -> None:
    results = spawn_gloo(_queue_worker, 2)
    (queue0, ptr0, keys), (queue1, ptr1, _) = results
    assert torch.equal(queue0, queue1) and ptr0 == ptr1 == (5 * 4) % 16
    # 5 global batches of 4 (rank 0's 2 keys, then rank 1's) into 16 slots:
    # slots 0-3 hold step 4 (wrapped), 4-15 steps 1, 2, 3.
    expected = torch.cat([keys[4], keys[1], keys[2], keys[3]])
    assert torch.equal(queue0, expected)


def _shuffle_worker(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)  # rank 0 draws the permutation; the others receive it
    x = torch.arange(4, dtype=torch.float32).unsqueeze(1) + 10 * rank  # rows 0..3 / 10..13
    shuffled, unshuffle = shuffle_across_ranks(x)
    restored = unshuffle_across_ranks(shuffled * 2, unshuffle)
    return x, shuffled, restored


def test_shuffle_bn_mixes_ranks_and_is_undone() -> None:
    results = spawn_gloo(_shuffle_worker, 2)
    rows = torch.cat([shuffled for _, shuffled, _ in results]).flatten().tolist()
    assert sorted(rows) == [0, 1, 2, 3, 10, 11, 12, 13]  # a permutation of the global batch
    rank0_rows = results[0][1].flatten().tolist()
    assert any(r >= 10 for r in rank0_rows), "rank 0 got only its own rows: not shuffled"
    for x, _, restored in results:
        assert torch.equal(restored, 2 * x)  # back in order, on the rank they came from


class _BatchStatEncoder(nn.Module):
    """Output = input minus the batch mean: depends on which rows share a batch (like BN)."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x - x.mean(dim=0, keepdim=True)]


def _hook_worker(rank: int, world_size: int, shuffle: bool) -> torch.Tensor:
    torch.manual_seed(3)
    loss = _loss(queue_size=16, dim=2, shuffle_batch=shuffle)
    loss.momentum_encoder = _BatchStatEncoder()
    assert isinstance(loss.required_hooks()[0], MoCoHook)
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        inputs = loss.teacher_loss_inputs({"data_momentum": [x]}, TeacherStep())
    assert inputs["enqueue"] is True
    return inputs["teacher_output"]


def test_hook_keys_depend_on_the_shuffled_sub_batch() -> None:
    plain = spawn_gloo(_hook_worker, 2, False)
    shuffled = spawn_gloo(_hook_worker, 2, True)
    assert any(not torch.allclose(a, b) for a, b in zip(plain, shuffled, strict=True))


def _config(batch: int, queue_size: int, dims: list[int]) -> AttrDict:
    return AttrDict(
        {
            "DATA": {"TRAIN": {"BATCHSIZE_PER_REPLICA": batch}},
            "MODEL": {"HEAD": {"PARAMS": [["mlp", {"dims": [16, 16]}], ["mlp", {"dims": dims}]]}},
            "LOSS": {"name": "moco_loss", "moco_loss": {"queue_size": queue_size}},
        }
    )


def test_queue_size_must_be_a_multiple_of_the_global_batch() -> None:
    cfg = _config(batch=6, queue_size=100, dims=[16, 8])
    with pytest.raises(ConfigError, match=r"queue_size=100 .* global batch 6") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.LOSS.moco_loss.queue_size"
    assert "96 or 102" in str(err.value)


def test_embedding_dim_is_inferred_from_the_head() -> None:
    cfg = _config(batch=4, queue_size=16, dims=[16, 8])
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, MoCoLoss) and loss.embedding_dim == 8
    assert loss.queue.shape == (16, 8)


@pytest.mark.parametrize(
    ("key", "value"),
    [("temperature", 0), ("momentum", 1.5), ("queue_size", 0), ("embedding_dim", "x")],
)
def test_bad_values_name_their_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        _loss(**{key: value})
    assert err.value.key_path == f"config.LOSS.moco_loss.{key}"
