"""swav_loss: the paper's formula written here, global Sinkhorn on 2 ranks vs 1, the
queue rule, per-rank queue checkpoints, hard assignments, config inference."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.swav_common import distributed_sinkhorn
from vissl.losses.swav_loss import SwAVLoss
from vissl.models.heads.swav_head import SwAVHead
from vissl.utils.test_utils import spawn_gloo

T, EPS, ITERS = 0.1, 0.05, 3


# ----------------------------------------------------------------------------- reference
def ref_sinkhorn(scores: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp as in the SwAV paper (Alg. / appendix), with explicit loops.

    Q = exp(S^T / eps), K x B, scaled to sum 1; then alternately each row (prototype) is
    scaled to total 1/K and each column (sample) to total 1/B; the result times B.
    """
    s = scores.detach().double()
    b, k = s.shape
    q = [[math.exp(float(s[i, j]) / eps) for i in range(b)] for j in range(k)]
    total = sum(sum(row) for row in q)
    q = [[v / total for v in row] for row in q]
    for _ in range(iters):
        for j in range(k):
            r = sum(q[j])
            q[j] = [v / r / k for v in q[j]]
        for i in range(b):
            c = sum(q[j][i] for j in range(k))
            for j in range(k):
                q[j][i] = q[j][i] / c / b
    return torch.tensor([[q[j][i] * b for j in range(k)] for i in range(b)], dtype=torch.float64)


def ref_swav(
    scores_per_head: list[torch.Tensor],
    num_crops: int,
    crops_for_assign: list[int],
    extra_code_scores: list[list[torch.Tensor]] | None = None,
    hard: bool = False,
) -> float:
    """mean_heads mean_{c in assign} mean_{p != c} -1/B sum_i sum_k q_c[i,k] log p_p[i,k]."""
    total = 0.0
    for h, scores in enumerate(scores_per_head):
        s = scores.detach().double()
        b = s.shape[0] // num_crops
        head_total = 0.0
        for j, c in enumerate(crops_for_assign):
            code_in = s[c * b : (c + 1) * b]
            if extra_code_scores is not None:
                code_in = torch.cat([code_in, extra_code_scores[h][j].double()])
            q = ref_sinkhorn(code_in, EPS, ITERS)[:b]
            if hard:
                q = torch.nn.functional.one_hot(q.argmax(1), q.shape[1]).double()
            crop_total = 0.0
            for p in range(num_crops):
                if p == c:
                    continue
                for i in range(b):
                    row = s[p * b + i] / T
                    log_z = math.log(sum(math.exp(float(v)) for v in row))
                    crop_total -= (
                        sum(
                            float(q[i, kk]) * (float(row[kk]) - log_z) for kk in range(row.shape[0])
                        )
                        / b
                    )
            head_total += crop_total / (num_crops - 1)
        total += head_total / len(crops_for_assign)
    return total / len(scores_per_head)


def make_loss(**kw: Any) -> SwAVLoss:
    args: dict[str, Any] = dict(
        temperature=T,
        epsilon=EPS,
        num_iters=ITERS,
        num_crops=2,
        crops_for_assign=[0, 1],
        num_prototypes=[6],
        embedding_dim=4,
    )
    args.update(kw)
    return SwAVLoss(**args)


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize(
    "num_crops,assign,protos", [(2, [0, 1], [6]), (4, [0, 1], [5, 3]), (3, [1], [7])]
)
def test_loss_matches_the_papers_formula(num_crops, assign, protos) -> None:
    torch.manual_seed(0)
    b = 5
    emb = torch.randn(num_crops * b, 4)
    scores = [torch.randn(num_crops * b, k) for k in protos]
    loss = make_loss(num_crops=num_crops, crops_for_assign=assign, num_prototypes=protos)
    got = loss([emb, *scores]).item()
    assert got == pytest.approx(ref_swav(scores, num_crops, assign), rel=1e-5)


def test_double_precision_gives_the_same_loss() -> None:
    torch.manual_seed(1)
    scores = torch.randn(8, 6)
    emb = torch.randn(8, 4)
    a = make_loss()([emb, scores]).item()
    b = make_loss(use_double_precision=True)([emb, scores]).item()
    assert a == pytest.approx(b, rel=1e-5)
    assert a == pytest.approx(ref_swav([scores], 2, [0, 1]), rel=1e-5)


def test_uniform_scores_give_ln_k() -> None:
    emb = torch.randn(12, 4)
    assert make_loss(num_crops=3)([emb, torch.zeros(12, 6)]).item() == pytest.approx(
        math.log(6), abs=1e-6
    )
    loss = make_loss(num_prototypes=[6, 30])
    got = loss([emb[:8], torch.full((8, 6), 0.3), torch.zeros(8, 30)]).item()
    assert got == pytest.approx((math.log(6) + math.log(30)) / 2, abs=1e-6)
    assert loss.uniform_loss == pytest.approx((math.log(6) + math.log(30)) / 2)


def test_sinkhorn_marginals_are_the_papers() -> None:
    torch.manual_seed(2)
    scores = torch.randn(12, 4) * 3
    q = distributed_sinkhorn(scores, 0.5, num_iters=3)
    # After the last (column) step, each sample's code sums to 1 exactly...
    assert torch.allclose(q.sum(dim=1), torch.ones(12), atol=1e-6)
    assert torch.allclose(q.double(), ref_sinkhorn(scores, 0.5, 3), atol=1e-6)
    # ...and with enough iterations each prototype gets B/K of the mass (equipartition).
    q = distributed_sinkhorn(scores, 0.5, num_iters=200)
    assert torch.allclose(q.sum(dim=0), torch.full((4,), 3.0), atol=1e-4)


def test_sinkhorn_does_not_overflow_in_fp32() -> None:
    # Cosine scores / 0.01: exp(100) is inf in float32 without the max subtracted.
    scores = torch.tensor([[1.0, 0.5], [0.9, -1.0]])
    assert not torch.isfinite(torch.exp(scores / 0.01)).all()
    q = distributed_sinkhorn(scores, 0.01, 3)
    assert torch.isfinite(q).all()
    assert torch.allclose(q.double(), distributed_sinkhorn(scores, 0.01, 3, True), atol=1e-6)


def test_hard_assignment_for_the_first_iterations() -> None:
    torch.manual_seed(3)
    emb = torch.randn(8, 4)
    scores = torch.randn(8, 6)
    loss = make_loss(temp_hard_assignment_iters=2)
    for _ in range(2):  # iterations 0 and 1: one-hot codes
        assert loss([emb, scores]).item() == pytest.approx(
            ref_swav([scores], 2, [0, 1], hard=True), rel=1e-5
        )
    assert loss([emb, scores]).item() == pytest.approx(ref_swav([scores], 2, [0, 1]), rel=1e-5)


def test_gradient_flows_only_through_the_predictions() -> None:
    torch.manual_seed(4)
    scores = torch.randn(8, 6, requires_grad=True)
    make_loss()([torch.randn(8, 4), scores]).backward()
    assert scores.grad is not None and scores.grad.abs().sum() > 0
    # The gradient of crop p's rows is softmax(s/T) - q_c over T, averaged: rows sum to 0.
    assert torch.allclose(scores.grad.sum(dim=1), torch.zeros(8), atol=1e-6)


def test_bad_inputs() -> None:
    loss = make_loss()
    with pytest.raises(ConfigError, match="num_prototypes"):
        loss([torch.randn(8, 4), torch.randn(8, 5)])
    with pytest.raises(ValueError, match="num_crops"):
        loss([torch.randn(7, 4), torch.randn(7, 6)])
    with pytest.raises(ValueError, match="swav_head output"):
        loss(torch.randn(8, 6))
    with pytest.raises(ConfigError, match="crops_for_assign"):
        make_loss(crops_for_assign=[0, 2])
    with pytest.raises(ConfigError, match="num_crops"):
        make_loss(num_crops=1, crops_for_assign=[0])
    with pytest.raises(ConfigError, match="epsilon"):
        make_loss(epsilon=0)


# ----------------------------------------------------------------------------- queue
def _head(k: int = 6, d: int = 4) -> SwAVHead:
    torch.manual_seed(5)
    return SwAVHead({}, dims=[d], num_clusters=[k])


def test_queue_is_used_only_when_full_and_from_start_iter() -> None:
    b, d = 3, 4
    head = _head()
    loss = make_loss(queue_length=2 * b, local_queue_length=2 * b, queue_start_iter=0)
    loss.bind_model(head)
    other = make_loss()  # no queue
    gen = torch.Generator().manual_seed(6)
    pushed: list[torch.Tensor] = []
    for step in range(4):
        emb = torch.nn.functional.normalize(torch.randn(2 * b, d, generator=gen), dim=1)
        scores = head(emb)[1]
        assert loss.queue.is_ready(loss.iteration) == (step >= 2)
        got = loss([emb, scores]).item()
        if step < 2:  # empty, then half full: the queue is not used
            assert got == pytest.approx(other([emb, scores]).item(), rel=1e-6)
        else:
            # queue = the last 2 batches' assign-crop embeddings, newest first
            w = head.prototypes0.weight.detach()
            extra = [
                [torch.cat([pushed[-1][j], pushed[-2][j]]) @ w.t() for j in range(2)],
            ]
            assert got == pytest.approx(ref_swav([scores], 2, [0, 1], extra), rel=1e-5)
            assert got != pytest.approx(other([emb, scores]).item(), rel=1e-3)
        pushed.append([emb[:b].clone(), emb[b:].clone()])
    assert loss.queue.filled == 2 * b

    late = make_loss(queue_length=2 * b, local_queue_length=2 * b, queue_start_iter=10)
    late.bind_model(head)
    for _ in range(4):
        emb = torch.nn.functional.normalize(torch.randn(2 * b, d, generator=gen), dim=1)
        scores = head(emb)[1]
        assert late([emb, scores]).item() == pytest.approx(other([emb, scores]).item(), rel=1e-6)
    assert late.queue.filled == 2 * b and not late.queue.is_ready(late.iteration)


def test_queue_scores_use_the_current_prototypes() -> None:
    b = 2
    head = _head()
    loss = make_loss(queue_length=b, local_queue_length=b)
    loss.bind_model(head)
    emb = torch.nn.functional.normalize(torch.randn(2 * b, 4), dim=1)
    loss([emb, head(emb)[1]])  # fills the queue
    with torch.no_grad():
        head.prototypes0.weight.mul_(-1.0)
    scores = head(emb)[1]
    extra = [[emb[:b] @ head.prototypes0.weight.t(), emb[b:] @ head.prototypes0.weight.t()]]
    assert loss([emb, scores]).item() == pytest.approx(
        ref_swav([scores], 2, [0, 1], [[e.detach() for e in extra[0]]]), rel=1e-5
    )


def test_queue_is_not_filled_in_eval_mode_and_not_in_state_dict() -> None:
    loss = make_loss(queue_length=4, local_queue_length=4)
    loss.bind_model(_head())
    loss.eval()
    loss([torch.randn(4, 4), torch.randn(4, 6)])
    assert loss.queue.filled == 0
    assert not any("queue" in k for k in loss.state_dict())


# ----------------------------------------------------------------------------- config
def _config(**overrides: Any) -> AttrDict:
    cfg = AttrDict(
        {
            "DATA": {
                "TRAIN": {
                    "BATCHSIZE_PER_REPLICA": 32,
                    "COLLATE_FUNCTION": "multicrop_collator",
                    "TRANSFORMS": [
                        {
                            "name": "ImgPilToMultiCrop",
                            "total_num_crops": 8,
                            "size_crops": [224, 96],
                            "num_crops": [2, 6],
                            "crop_scales": [[0.14, 1], [0.05, 0.14]],
                        }
                    ],
                }
            },
            "MODEL": {
                "HEAD": {
                    "PARAMS": [
                        ["swav_head", {"dims": [2048, 2048, 64], "num_clusters": [300, 100]}]
                    ]
                }
            },
            "CHECKPOINT": {"DIR": "/tmp/ckpt"},
        }
    )
    for k, v in overrides.items():
        cfg.DATA.TRAIN[k] = v
    return cfg


def _loss_cfg(queue_length: int = 1000) -> AttrDict:
    return AttrDict(
        {
            "name": "swav_loss",
            "swav_loss": {
                "temperature": 0.1,
                "crops_for_assign": [0, 1],
                "num_crops": 2,
                "num_prototypes": [3000],
                "embedding_dim": 128,
                "output_dir": "",
                "queue": {"queue_length": queue_length, "start_iter": 0, "local_queue_length": 0},
            },
        }
    )


def test_infer_config_from_transforms_head_and_batch(caplog) -> None:
    with caplog.at_level(logging.INFO):
        loss = build_loss(_loss_cfg(1000), _config())
    assert isinstance(loss, SwAVLoss)
    assert loss.num_crops == 8
    assert loss.num_prototypes == [300, 100]
    assert loss.embedding_dim == 64
    assert loss.queue_length == 992 and loss.queue.length == 992  # 1000 -> 31 * 32
    assert loss.output_dir == "/tmp/ckpt"
    assert "rounded down to 992" in caplog.text


def test_infer_config_replicate_and_collator_check() -> None:
    cfg = _config(TRANSFORMS=[{"name": "ImgReplicatePil", "num_times": 3}])
    assert build_loss(_loss_cfg(0), cfg).num_crops == 3
    with pytest.raises(ConfigError, match="multicrop_collator") as err:
        build_loss(_loss_cfg(0), _config(COLLATE_FUNCTION="simclr_collator"))
    assert err.value.key_path == "config.DATA.TRAIN.COLLATE_FUNCTION"


# ----------------------------------------------------------------------------- 2 ranks
def _global_scores(world: int, b: int, k: int, crops: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randn(crops * b, k, generator=gen) for _ in range(world)]


def _sinkhorn_and_loss_worker(rank: int, world: int, b: int, k: int) -> tuple:
    per_rank = _global_scores(world, b, k, 2)
    q = distributed_sinkhorn(per_rank[rank][:b], EPS, ITERS)
    scores = per_rank[rank].clone().requires_grad_(True)
    loss = make_loss(num_prototypes=[k])([torch.zeros(2 * b, 4), scores])
    loss.backward()
    return q.tolist(), loss.item(), scores.grad.tolist()


def test_two_ranks_match_one_process_on_the_global_batch() -> None:
    world, b, k = 2, 3, 5
    results = spawn_gloo(_sinkhorn_and_loss_worker, world, b, k)
    per_rank = _global_scores(world, b, k, 2)
    # Sinkhorn of crop 0 over the global batch (rank 0's rows, then rank 1's).
    q_single = distributed_sinkhorn(torch.cat([s[:b] for s in per_rank]), EPS, ITERS)
    q_ranks = torch.cat([torch.tensor(r[0]) for r in results])
    assert torch.allclose(q_ranks, q_single, atol=1e-6)
    # The loss on one process of the global batch (crop-major over 2b samples).
    single_in = torch.cat(
        [torch.cat([s[:b] for s in per_rank]), torch.cat([s[b:] for s in per_rank])]
    )
    single_in.requires_grad_(True)
    single = make_loss(num_prototypes=[k])([torch.zeros(4 * b, 4), single_in])
    single.backward()
    assert sum(r[1] for r in results) / world == pytest.approx(single.item(), rel=1e-5)
    assert single.item() == pytest.approx(ref_swav([single_in.detach()], 2, [0, 1]), rel=1e-5)
    # Each rank's gradient is world x the single-process gradient of its own rows.
    n = world * b
    for rank, (_, _, grad) in enumerate(results):
        expected = torch.cat(
            [
                single_in.grad[rank * b : (rank + 1) * b],
                single_in.grad[n + rank * b : n + (rank + 1) * b],
            ]
        )
        assert torch.allclose(torch.tensor(grad), world * expected, atol=1e-6)
        assert torch.tensor(grad).abs().sum() > 0


class _Precision:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _fake_task(loss: SwAVLoss, model: torch.nn.Module) -> SimpleNamespace:
    return SimpleNamespace(
        base_model=model,
        loss=loss,
        meters=[],
        optimizer=None,
        hooks=[],
        precision=_Precision(),
        train=True,
        phase_idx=0,
        train_phase_idx=0,
        num_updates=3,
        iteration=3,
        local_iteration_num=3,
        config=AttrDict({}),
        phase_loss_state=lambda: (0.0, 0),
        pending_resume=None,
    )


def _queue_checkpoint_worker(rank: int, world: int) -> tuple:
    from vissl.trainer.checkpointing import checkpoint_state, restore_checkpoint_state

    torch.manual_seed(0)
    head = SwAVHead({}, dims=[4], num_clusters=[6])
    loss = make_loss(num_prototypes=[6], queue_length=8, local_queue_length=4)
    loss.bind_model(head)
    emb = torch.full((4, 4), float(rank + 1))  # each rank queues its own values
    loss([emb, torch.randn(4, 6)])
    loss([emb * 10, torch.randn(4, 6)])
    saved = loss.queue.embeddings.clone()
    state = checkpoint_state(_fake_task(loss, head))
    # rank 0 writes the checkpoint (it alone holds every rank's state); every rank
    # restores from that file
    written = [state]
    torch.distributed.broadcast_object_list(written, src=0)
    fresh = make_loss(num_prototypes=[6], queue_length=8, local_queue_length=4)
    fresh.bind_model(head)
    restore_checkpoint_state(_fake_task(fresh, head), written[0])
    return saved.tolist(), fresh.queue.embeddings.tolist(), fresh.queue.filled


def test_each_rank_gets_its_own_queue_back() -> None:
    results = spawn_gloo(_queue_checkpoint_worker, 2)
    for rank, (saved, restored, filled) in enumerate(results):
        assert restored == saved
        assert filled == 4
        # newest first: the second batch (x10), then the first
        assert saved[0][0][0] == 10.0 * (rank + 1) and saved[0][2][0] == float(rank + 1)
    assert results[0][1] != results[1][1]
