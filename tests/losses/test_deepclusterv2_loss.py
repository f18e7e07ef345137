"""deepclusterv2_loss: the loss against the SwAV paper's DeepCluster-v2 objective written
here (values and gradients; unassigned samples left out), the swav_head path (frozen
prototypes equal to the centroids), the memory's writes, k-means against a hand-written
spherical k-means, the initial draw, 2 gloo processes (each with half of the memory)
against one process holding all of it (centroids, assignment table, loss), per-rank state
and config inference and errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.deepclusterv2_loss import (
    NO_ASSIGNMENT,
    DeepClusterV2Loss,
    choose_initial_samples,
    kmeans_seed,
    spherical_kmeans,
)
from vissl.models.heads.swav_head import SwAVHead
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

T = 0.1


# ----------------------------------------------------------------------------- references
def ref_loss(
    emb: torch.Tensor,
    index: list[int],
    centroids: list[torch.Tensor],
    assignments: list[list[int]],
    temperature: float = T,
) -> torch.Tensor:
    """The DeepCluster-v2 objective, from the paper, in float64, row by row:

        L = 1/H sum_h mean_{rows r with an assignment} -log p_h(a_h(i_r) | z_r)
        p_h(k | z) = exp(z . c_hk / T) / sum_k' exp(z . c_hk' / T),   z = e / |e|

    ``assignments[h][i]`` < 0: sample ``i`` has none (left out)."""
    total = torch.zeros((), dtype=torch.float64)
    for h, c in enumerate(centroids):
        terms = []
        for r, i in enumerate(index):
            a = assignments[h][i]
            if a < 0:
                continue
            z = emb[r].double() / emb[r].double().norm()
            logits = torch.stack([z @ c[k].double() / temperature for k in range(c.shape[0])])
            terms.append(-(logits[a] - torch.logsumexp(logits, dim=0)))
        total = total + torch.stack(terms).mean()
    return total / len(centroids)


def ref_kmeans(points: torch.Tensor, init: list[int], iters: int) -> tuple[torch.Tensor, list[int]]:
    """Spherical k-means by hand (float64): start at the given points; ``iters`` times
    assign each point to the centroid of largest cosine (the first on ties) and move each
    centroid that got points to their mean projected on the sphere; assign once more."""
    x = [p.double() / p.double().norm() for p in points]
    cents = [x[i].clone() for i in init]

    def assign() -> list[int]:
        out = []
        for p in x:
            dots = [float(p @ c) for c in cents]
            out.append(dots.index(max(dots)))
        return out

    labels = assign()
    for _ in range(iters):
        for k in range(len(cents)):
            members = [x[j] for j in range(len(x)) if labels[j] == k]
            if members:
                mean = torch.stack(members).sum(0) / len(members)
                cents[k] = mean / mean.norm()
        labels = assign()
    return torch.stack(cents), labels


def clustered_points(n: int, dim: int, groups: int, seed: int) -> torch.Tensor:
    """``n`` unit vectors around ``groups`` random directions (well separated)."""
    g = torch.Generator().manual_seed(seed)
    centers = nn.functional.normalize(torch.randn(groups, dim, generator=g), dim=1)
    which = torch.arange(n) % groups
    points = centers[which] + 0.25 * torch.randn(n, dim, generator=g)
    return nn.functional.normalize(points, dim=1)


def _loss(**kwargs: Any) -> DeepClusterV2Loss:
    args: dict[str, Any] = {
        "num_train_samples": 6,
        "BATCHSIZE_PER_REPLICA": 3,
        "DROP_LAST": False,
        "num_crops": 2,
        "temperature": T,
        "num_clusters": [3, 4],
        "kmeans_iters": 5,
        "crops_for_mb": [0, 1],
        "embedding_dim": 5,
        "world_size": 1,
    }
    args.update(kwargs)
    return DeepClusterV2Loss(**args)


def _set_clusters(loss: DeepClusterV2Loss, seed: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    centroids, table = [], []
    for h, k in enumerate(loss.num_clusters):
        c = nn.functional.normalize(torch.randn(k, loss.embedding_dim, generator=g), dim=1)
        loss.centroids(h).copy_(c)
        row = torch.randint(0, k, (loss.num_train_samples,), generator=g)
        row[1] = NO_ASSIGNMENT  # sample 1 was not in the memory
        loss.assignments[h].copy_(row)
        centroids.append(c)
        table.append(row.tolist())
    return centroids, table


# ----------------------------------------------------------------------------- formula
def test_loss_and_gradients_match_the_papers_objective() -> None:
    loss = _loss()
    centroids, table = _set_clusters(loss, seed=1)
    index = [4, 1, 0, 4, 1, 0]  # 3 samples x 2 crops, crop-major; sample 1 unassigned
    emb = torch.randn(6, 5, generator=torch.Generator().manual_seed(2), requires_grad=True)
    value = loss(emb, torch.tensor(index))
    value.backward()
    grad = emb.grad.clone()
    ref_emb = emb.detach().clone().requires_grad_()
    ref = ref_loss(ref_emb, index, centroids, table)
    ref.backward()
    assert value.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_emb.grad.float(), rtol=1e-5, atol=1e-7)
    # the unassigned sample's rows get no gradient; the others do
    assert grad[[1, 4]].abs().sum() == 0 and grad[[0, 2, 3, 5]].abs().min() > 0


def test_a_batch_without_any_assignment_gives_zero_not_nan() -> None:
    loss = _loss()
    _set_clusters(loss, seed=3)
    value = loss(torch.randn(2, 5), torch.tensor([1, 1]))
    assert value.item() == 0.0


def test_a_bf16_autocast_still_computes_in_fp32() -> None:
    loss = _loss()
    centroids, table = _set_clusters(loss, seed=4)
    emb = torch.randn(6, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(emb.bfloat16(), torch.tensor([0, 2, 3, 0, 2, 3]))
    assert value.dtype == torch.float32
    ref = ref_loss(emb.bfloat16().float(), [0, 2, 3, 0, 2, 3], centroids, table)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)


class _SwAVModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.trunk = nn.Linear(4, 8)
        self.head = SwAVHead({}, dims=[8, 5], use_bn=False, num_clusters=[3, 4])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.head(self.trunk(x))


def test_a_swav_head_holds_the_centroids_as_frozen_prototypes() -> None:
    """bind_model freezes the prototypes and copies the centroids into them (also after
    each clustering); the loss from the head's scores is the objective's."""
    model = _SwAVModel()
    loss = _loss()
    loss.bind_model(model)
    centroids, table = _set_clusters(loss, seed=6)
    assert not any(p.requires_grad for p in model.head.prototype_layers()[0].parameters())
    assert model.trunk.weight.requires_grad
    loss._copy_centroids_to_prototypes()
    for h, layer in enumerate(model.head.prototype_layers()):
        assert torch.equal(layer.weight, centroids[h])
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(7))
    index = [0, 2, 5, 0, 2, 5]
    out = model(x)
    value = loss(out, torch.tensor(index))
    ref = ref_loss(model.head.projection_head(model.trunk(x)), index, centroids, table)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)
    value.backward()
    assert model.trunk.weight.grad is not None and model.trunk.weight.grad.abs().sum() > 0


def test_a_swav_head_that_disagrees_with_the_loss_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="prototypes \\[3, 4\\]"):
        _loss(num_clusters=[3, 3]).bind_model(_SwAVModel())


# ----------------------------------------------------------------------------- memory
def test_training_writes_the_memory_crops_and_evaluation_does_not() -> None:
    loss = _loss(crops_for_mb=[1])
    _set_clusters(loss, seed=8)
    emb = torch.randn(6, 5)
    loss(emb, torch.tensor([5, 3, 0, 5, 3, 0]))
    unit = nn.functional.normalize(emb, dim=1)
    assert loss.start_idx == 3
    assert loss.local_memory_index.tolist() == [5, 3, 0, -1, -1, -1]
    torch.testing.assert_close(loss.local_memory_embeddings[0, :3], unit[3:])  # crop 1
    loss(emb[[0, 3]], torch.tensor([2, 2]))
    assert loss.local_memory_index.tolist() == [5, 3, 0, 2, -1, -1]
    before = loss.local_memory_embeddings.clone()
    loss.eval()
    value = loss(emb, torch.tensor([1, 4, 2, 1, 4, 2]))
    assert loss.start_idx == 4 and torch.equal(loss.local_memory_embeddings, before)
    # evaluation: the targets are the nearest centroids of crop crops_for_mb[0] = 1
    targets = [
        [int((unit[3 + i] @ loss.centroids(h).t()).argmax()) for i in range(3)] for h in range(2)
    ]
    table = [[NO_ASSIGNMENT] * 6 for _ in range(2)]
    for h in range(2):
        for i, sample in enumerate([1, 4, 2]):
            table[h][sample] = targets[h][i]
    ref = ref_loss(emb, [1, 4, 2, 1, 4, 2], [loss.centroids(h) for h in range(2)], table)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)


def test_more_samples_than_memory_rows_is_an_error() -> None:
    loss = _loss(num_train_samples=3)
    _set_clusters(loss, seed=9)
    loss(torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2]))
    with pytest.raises(RuntimeError, match="more samples than the memory"):
        loss(torch.randn(2, 5), torch.tensor([0, 0]))


def test_the_memory_size_follows_vissls_rule() -> None:
    # ceil(N / world) rows, less the last partial batch with DROP_LAST
    assert (
        _loss(num_train_samples=250, world_size=2, BATCHSIZE_PER_REPLICA=16).memory_size(250) == 125
    )
    assert _loss(world_size=2, BATCHSIZE_PER_REPLICA=16, DROP_LAST=True).memory_size(250) == 112
    assert (
        _loss(world_size=8, BATCHSIZE_PER_REPLICA=64, DROP_LAST=True).memory_size(1281167) == 160128
    )


def test_init_memory_fills_every_row_from_the_memory_crops() -> None:
    loss = _loss(crops_for_mb=[1, 0])
    weights = torch.randn(3, 5)
    calls = []

    def model(crops: list[torch.Tensor]) -> torch.Tensor:
        calls.append(len(crops))
        return torch.cat(crops) @ weights

    crops0, crops1 = torch.randn(6, 3), torch.randn(6, 3)
    batches = [
        ([crops0[:3], crops1[:3]], torch.tensor([4, 0, 2] * 2)),
        ([crops0[3:], crops1[3:]], torch.tensor([1, 5, 3] * 2)),
    ]
    loss.init_memory(batches, model)
    assert calls == [2, 2] and loss.memory_ready and loss.start_idx == 6
    assert loss.local_memory_index.tolist() == [4, 0, 2, 1, 5, 3]
    unit = nn.functional.normalize
    torch.testing.assert_close(loss.local_memory_embeddings[0], unit(crops1 @ weights, dim=1))
    torch.testing.assert_close(loss.local_memory_embeddings[1], unit(crops0 @ weights, dim=1))


# ----------------------------------------------------------------------------- k-means
def test_kmeans_matches_a_hand_written_spherical_kmeans() -> None:
    points = clustered_points(60, 4, groups=5, seed=10)
    init = [3, 17, 22, 40, 41, 58]
    centroids, labels = spherical_kmeans(
        points, torch.arange(60), torch.tensor(init), num_iters=7, num_samples=60
    )
    ref_c, ref_labels = ref_kmeans(points, init, 7)
    assert labels.tolist() == ref_labels
    torch.testing.assert_close(centroids, ref_c.float(), rtol=0, atol=1e-6)
    assert len(set(ref_labels)) > 1 and ref_labels != ref_kmeans(points, init, 0)[1]


def test_an_empty_cluster_keeps_its_centroid() -> None:
    """Two identical starts: the first assignment gives every tie to the first, so the
    second cluster is empty in the update and keeps its centroid."""
    points = clustered_points(12, 3, groups=2, seed=11)
    points[5] = points[4]
    centroids, labels = spherical_kmeans(
        points, torch.arange(12), torch.tensor([4, 5, 0]), num_iters=1, num_samples=12
    )
    ref_c, ref_labels = ref_kmeans(points, [4, 5, 0], 1)
    assert 1 not in ref_kmeans(points, [4, 5, 0], 0)[1]
    assert labels.tolist() == ref_labels
    torch.testing.assert_close(centroids[1], points[5], rtol=0, atol=1e-6)
    torch.testing.assert_close(centroids, ref_c.float(), rtol=0, atol=1e-6)
    assert not torch.allclose(centroids[0], points[4])  # the first one moved


def test_the_initial_draw_is_distinct_present_samples_fixed_by_the_seed() -> None:
    index = torch.tensor([7, 2, 9, 4, -1, 11, 0])
    first = choose_initial_samples(index, 12, 4, seed=3)
    assert first.tolist() == choose_initial_samples(index, 12, 4, seed=3).tolist()
    assert len(set(first.tolist())) == 4 and set(first.tolist()) <= {7, 2, 9, 4, 11, 0}
    # the first 4 present samples of the seeded permutation
    order = torch.randperm(12, generator=torch.Generator().manual_seed(3)).tolist()
    assert first.tolist() == [i for i in order if i in {7, 2, 9, 4, 11, 0}][:4]
    draws = {tuple(choose_initial_samples(index, 12, 4, seed=s).tolist()) for s in range(5)}
    assert len(draws) > 1
    with pytest.raises(ValueError, match="at least as many samples"):
        choose_initial_samples(index, 12, 7, seed=0)
    assert kmeans_seed(0, 1, 0) != kmeans_seed(0, 2, 0) != kmeans_seed(0, 2, 1)


def test_cluster_memory_fills_the_table_centroids_and_prototypes() -> None:
    """One process: each clustering h runs the hand-written k-means on memory crop
    h % 2 from the seeded draw; the table holds each sample's cluster, -100 for samples
    not in the memory; the swav_head's prototypes follow; writing starts again at 0."""
    model = _SwAVModel()
    loss = _loss(num_train_samples=10, num_clusters=[3, 4], crops_for_mb=[0, 1])
    loss.bind_model(model)
    present = [8, 1, 6, 3, 0, 9, 5, 2]  # samples 4 and 7 were dropped
    crops = [clustered_points(8, 5, groups=3, seed=12 + j) for j in range(2)]
    loss._write_memory(torch.tensor(present), crops)
    loss.memory_ready = True
    loss.cluster_memory(seed=4, epoch=2)
    assert loss.start_idx == 0
    for h, k in enumerate([3, 4]):
        init = choose_initial_samples(loss.local_memory_index, 10, k, kmeans_seed(4, 2, h))
        rows = [present.index(int(i)) for i in init]
        ref_c, ref_labels = ref_kmeans(crops[h % 2], rows, 5)
        torch.testing.assert_close(loss.centroids(h), ref_c.float(), rtol=0, atol=1e-6)
        table = loss.assignments[h].tolist()
        assert [table[i] for i in present] == ref_labels
        assert table[4] == table[7] == NO_ASSIGNMENT
        assert torch.equal(model.head.prototype_layers()[h].weight, loss.centroids(h))


# ----------------------------------------------------------------------------- 2 ranks
N, WORLD = 40, 2


def _memory(seed: int) -> list[torch.Tensor]:
    return [clustered_points(N, 6, groups=4, seed=seed + j) for j in range(2)]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(30)
    return torch.randn(8, 6, generator=g), torch.tensor([3, 17, 22, 38] * 2)


def _cluster_and_score(rank: int, world: int) -> dict[str, Any]:
    """Rank r holds samples r, r + world, ...; 1 process holds them all."""
    loss = DeepClusterV2Loss(
        num_train_samples=N,
        BATCHSIZE_PER_REPLICA=4,
        DROP_LAST=False,
        num_clusters=[5, 7, 6],
        kmeans_iters=6,
        crops_for_mb=[0, 1],
        embedding_dim=6,
        world_size=world,
    )
    order = torch.randperm(N, generator=torch.Generator().manual_seed(31))  # shuffled rows
    mine = order[rank::world]
    memory = _memory(20)
    loss._write_memory(mine, [m[mine] for m in memory])
    loss.memory_ready = True
    loss.cluster_memory(seed=7, epoch=1)
    emb, index = _batch()
    value = loss(emb, index)
    return {
        "centroids": [loss.centroids(h).clone() for h in range(3)],
        "assignments": loss.assignments.clone(),
        "loss": value.item(),
    }


def test_two_processes_cluster_like_one_process_holding_the_whole_memory() -> None:
    """The draw, the all-reduced sums and counts and the gathered table make 2 processes,
    each with half of the memory, agree with each other and with one process."""
    one = _cluster_and_score(0, 1)
    two = spawn_gloo(_cluster_and_score, WORLD)
    assert (one["assignments"] != NO_ASSIGNMENT).all()
    for r in two:
        assert torch.equal(r["assignments"], one["assignments"])
        for a, b in zip(r["centroids"], one["centroids"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        assert r["loss"] == pytest.approx(one["loss"], rel=1e-6)
    # the ranks are bitwise equal to each other (the same all-reduced values)
    for a, b in zip(two[0]["centroids"], two[1]["centroids"], strict=True):
        assert torch.equal(a, b)
    # the clusterings differ (different crops, k and draws): the test is not vacuous
    assert not torch.equal(one["assignments"][0], one["assignments"][2])


# ----------------------------------------------------------------------------- state
def test_memory_is_per_rank_state_and_the_table_is_in_state_dict() -> None:
    loss = _loss()
    _set_clusters(loss, seed=13)
    loss(torch.randn(6, 5), torch.tensor([0, 2, 5, 0, 2, 5]))
    loss.memory_ready = True
    assert set(loss.state_dict()) == {"centroids0", "centroids1", "assignments"}
    other = _loss(num_train_samples=-1)  # built before the data set's size was known
    other.load_state_dict(loss.state_dict())
    assert torch.equal(other.assignments, loss.assignments)
    other.load_rank_state_dict(loss.rank_state_dict())
    assert other.memory_ready
    assert torch.equal(other.local_memory_embeddings, loss.local_memory_embeddings)
    assert torch.equal(other.local_memory_index, loss.local_memory_index)
    smaller = _loss(num_train_samples=4)
    smaller.load_rank_state_dict(loss.rank_state_dict())  # another shape: a warning
    assert not smaller.memory_ready


# ----------------------------------------------------------------------------- config
def _config(*overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(
        ["config=test/integration_test/quick_deepcluster_v2", *overrides]
    )
    return cfg


def test_vissls_loss_keys_are_accepted_and_inferred() -> None:
    """VISSL's quick config's loss block (BATCHSIZE_PER_REPLICA 64, num_train_samples
    500, memory_params.crops_for_mb) validates; batch, DROP_LAST, crops and the head's
    clusters and width are taken from the rest of the config."""
    cfg = _config(
        "config.LOSS.deepclusterv2_loss.BATCHSIZE_PER_REPLICA=64",
        "config.LOSS.deepclusterv2_loss.num_train_samples=500",
        "config.LOSS.deepclusterv2_loss.num_clusters=[10,10,10]",
        "config.LOSS.deepclusterv2_loss.memory_params.embedding_dim=128",
        "config.LOSS.deepclusterv2_loss.num_crops=4",
    )
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, DeepClusterV2Loss)
    assert (loss.batch_size, loss.drop_last, loss.num_crops) == (8, True, 2)
    assert (loss.num_clusters, loss.embedding_dim, loss.crops_for_mb) == ([8, 8, 8], 16, [0, 1])
    assert loss.local_memory_size == 500 - 500 % 8


def test_plain_mlp_heads_give_the_embedding_width() -> None:
    cfg = _config("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}]]")
    loss = build_loss(cfg.LOSS, cfg)
    assert loss.embedding_dim == 32 and loss.num_clusters == [8, 8, 8]


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("config.DATA.TRAIN.COLLATE_FUNCTION=simclr_collator", "multicrop_collator"),
        ("config.DATA.TRAIN.LABEL_TYPE=standard", "sample indices"),
        ("config.LOSS.deepclusterv2_loss.temperature=0", "temperature must be a number > 0"),
        ("config.LOSS.deepclusterv2_loss.memory_params.crops_for_mb=[0,2]", "crops_for_mb"),
        ("config.LOSS.deepclusterv2_loss.kmeans_iters=-1", "kmeans_iters"),
    ],
)
def test_config_mistakes_are_config_errors(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = _config(override)
        build_loss(cfg.LOSS, cfg)


def test_bad_num_clusters_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config.LOSS.deepclusterv2_loss.num_clusters"):
        _loss(num_clusters=[3, 0])
    assert math.isfinite(_loss().temperature)


def test_vissls_old_distr_on_key_is_ignored_with_a_warning() -> None:
    """VISSL 0.1.6's quick_deepcluster_v2.yaml still sets DISTRIBUTED.DISTR_ON."""
    from vissl.config.validation import UnsupportedConfigWarning

    with pytest.warns(UnsupportedConfigWarning, match="DISTR_ON"):
        cfg = _config("+config.DISTRIBUTED.DISTR_ON=True")
    assert "DISTR_ON" not in cfg.DISTRIBUTED


def test_an_image_in_two_memory_rows_gets_the_larger_of_its_clusters() -> None:
    """The sampler's padding can put one image in two rows (two processes, or the same
    one): its table entry does not depend on the order of the writes."""
    loss = _loss(num_train_samples=5, num_clusters=[2], crops_for_mb=[0], kmeans_iters=0)
    rows = nn.functional.normalize(
        torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0], [1.0, 0.1, 0, 0, 0]]), dim=1
    )
    loss._write_memory(torch.tensor([3, 1, 1]), [rows[[0, 1, 2]]])
    loss.memory_ready = True
    loss.cluster_memory(seed=0, epoch=0)
    c = loss.centroids(0)
    labels = [int((r @ c.t()).argmax()) for r in rows]
    assert labels[1] != labels[2]  # the two rows of image 1 are in different clusters
    table = loss.assignments[0].tolist()
    assert table[1] == max(labels[1], labels[2]) and table[3] == labels[0]
    assert table[0] == table[2] == table[4] == NO_ASSIGNMENT
