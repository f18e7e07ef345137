"""Multi-crop SimCLR loss: a naive reference with loops, == SimCLR with 2 crops (1 and 2
processes), 2 processes vs 1 on the global batch (loss and gradients), config inference."""

from __future__ import annotations

import math

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss, infer_loss_config
from vissl.losses.multicrop_simclr_info_nce_loss import MultiCropSimclrInfoNCELoss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from vissl.utils.test_utils import spawn_gloo

TEMPERATURE = 0.1


def naive_multicrop_nt_xent(
    per_rank: list[torch.Tensor], rank: int, num_crops: int, temperature: float
) -> float:
    """The loss of ``rank`` written with loops, from the formula.

    Every rank's rows are crop-major (row ``k * B + i`` is crop ``k`` of sample ``i``);
    crops 0 and 1 are large. For each sample of ``rank`` and each ordered pair of its
    crops ``(k, j)``, ``k != j``, with ``k`` or ``j`` large: one term
    ``-log(e^{a.p/T} / (e^{a.p/T} + sum_n e^{a.n/T}))`` with anchor crop ``k``,
    positive crop ``j`` and negatives every row of every rank that is not a crop of
    the sample. The loss is the mean of the terms.
    """
    rows = []  # (rank, crop, sample, unit vector)
    for r, emb in enumerate(per_rank):
        b = emb.shape[0] // num_crops
        for row in range(emb.shape[0]):
            v = emb[row].double()
            rows.append((r, row // b, row % b, v / v.norm()))
    total = 0.0
    count = 0
    for r, crop, sample, anchor in rows:
        if r != rank:
            continue
        neg = 0.0
        for r2, _, sample2, other in rows:
            if not (r2 == r and sample2 == sample):
                neg += math.exp(float(anchor @ other) / temperature)
        for r2, crop2, sample2, other in rows:
            if r2 != r or sample2 != sample or crop2 == crop:
                continue
            if crop >= 2 and crop2 >= 2:
                continue  # small crops are compared with the large crops only
            pos = math.exp(float(anchor @ other) / temperature)
            total += -math.log(pos / (pos + neg))
            count += 1
    return total / count


def _loss(num_crops: int, temperature: float = TEMPERATURE, dim: int = 8):
    cfg = AttrDict(
        name="multicrop_simclr_info_nce_loss",
        multicrop_simclr_info_nce_loss={
            "temperature": temperature,
            "num_crops": num_crops,
            "buffer_params": {"embedding_dim": dim, "world_size": 64, "effective_batch_size": 4096},
        },
    )
    loss = build_loss(cfg)
    assert isinstance(loss, MultiCropSimclrInfoNCELoss)
    return loss


def _simclr(temperature: float = TEMPERATURE, dim: int = 8) -> SimclrInfoNCELoss:
    cfg = AttrDict(
        name="simclr_info_nce_loss",
        simclr_info_nce_loss={"temperature": temperature, "buffer_params": {"embedding_dim": dim}},
    )
    loss = build_loss(cfg)
    assert isinstance(loss, SimclrInfoNCELoss)
    return loss


@pytest.mark.parametrize("num_crops", [2, 3, 4, 8])
def test_single_process_matches_naive_formula(num_crops: int) -> None:
    torch.manual_seed(num_crops)
    emb = torch.randn(num_crops * 5, 8)  # B = 5 samples
    got = _loss(num_crops)(emb, None)
    expected = naive_multicrop_nt_xent([emb], 0, num_crops, TEMPERATURE)
    assert got.item() == pytest.approx(expected, rel=1e-5)


def test_small_crops_are_not_compared_with_each_other() -> None:
    """Small-small pairs are left out: the loss matches the reference that skips them,
    and is far from the one that counts every ordered pair of crops."""
    torch.manual_seed(3)
    b, dim = 4, 8
    emb = torch.randn(6 * b, dim)
    got = _loss(6, dim=dim)(emb, None).item()
    assert got == pytest.approx(naive_multicrop_nt_xent([emb], 0, 6, TEMPERATURE), rel=1e-5)
    assert abs(got - _all_pairs_reference(emb, 6, TEMPERATURE)) > 1e-2


def _all_pairs_reference(emb: torch.Tensor, num_crops: int, temperature: float) -> float:
    """Every ordered pair of crops counted (what the loss must NOT compute)."""
    z = torch.nn.functional.normalize(emb.double(), dim=1)
    b = emb.shape[0] // num_crops
    sim = torch.exp(z @ z.t() / temperature)
    sample = torch.arange(emb.shape[0]) % b
    same = sample[:, None] == sample[None, :]
    neg = (sim * ~same).sum(1)
    terms = -torch.log(sim / (sim + neg[:, None]))
    pairs = same & ~torch.eye(emb.shape[0], dtype=torch.bool)
    return float(terms[pairs].mean())


def test_two_crops_equal_simclr_on_one_process() -> None:
    torch.manual_seed(4)
    emb = torch.randn(12, 8)
    a = emb.clone().requires_grad_(True)
    b = emb.clone().requires_grad_(True)
    ours = _loss(2)(a, None)
    simclr = _simclr()(b, None)
    ours.backward()
    simclr.backward()
    assert ours.item() == pytest.approx(simclr.item(), rel=1e-6)
    assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_small_temperature_does_not_overflow() -> None:
    torch.manual_seed(5)
    emb = torch.randn(4 * 3, 8)
    got = _loss(4, temperature=0.005)(emb, None)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(naive_multicrop_nt_xent([emb], 0, 4, 0.005), rel=1e-4)


def test_bad_inputs_raise() -> None:
    loss = _loss(4)
    with pytest.raises(ConfigError, match=r"not num_crops=4 crops") as err:
        loss(torch.randn(10, 8), None)  # 10 rows are not 4 crops of each sample
    assert err.value.key_path == "config.LOSS.multicrop_simclr_info_nce_loss.num_crops"
    with pytest.raises(ConfigError, match=r"buffer_params\.embedding_dim"):
        loss(torch.randn(8, 16), None)
    with pytest.raises(ConfigError, match=r"num_crops must be an integer >= 2 \(2 large crops"):
        MultiCropSimclrInfoNCELoss(num_crops=1)
    with pytest.raises(ConfigError, match=r"temperature must be a number > 0"):
        MultiCropSimclrInfoNCELoss(temperature=0.0, num_crops=4)


def _config(collator: str = "multicrop_collator", num_crops: int = 2) -> AttrDict:
    return AttrDict(
        {
            "DATA": {
                "TRAIN": {
                    "BATCHSIZE_PER_REPLICA": 16,
                    "COLLATE_FUNCTION": collator,
                    "TRANSFORMS": [
                        {
                            "name": "ImgPilToMultiCrop",
                            "total_num_crops": 8,
                            "size_crops": [224, 96],
                            "num_crops": [2, 6],
                            "crop_scales": [[0.14, 1.0], [0.05, 0.14]],
                        },
                        {"name": "ToTensor"},
                    ],
                }
            },
            "DISTRIBUTED": {"NUM_NODES": 2, "NUM_PROC_PER_NODE": 4},
            "MODEL": {
                "HEAD": {"PARAMS": [["mlp", {"dims": [2048, 2048]}], ["mlp", {"dims": [2048, 96]}]]}
            },
            "LOSS": {
                "name": "multicrop_simclr_info_nce_loss",
                "multicrop_simclr_info_nce_loss": {
                    "temperature": 0.2,
                    "num_crops": num_crops,
                    "buffer_params": {
                        "world_size": 64,
                        "embedding_dim": 128,
                        "effective_batch_size": 4096,
                    },
                },
            },
        }
    )


def test_infer_config_from_transform_head_and_batch() -> None:
    cfg = _config()
    given = cfg.to_dict()
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, MultiCropSimclrInfoNCELoss)
    assert cfg.to_dict() == given  # the build derives on a copy: the config is unchanged
    infer_loss_config(cfg)  # what the config stage writes into the config
    params = cfg.LOSS.multicrop_simclr_info_nce_loss
    assert params.num_crops == 8 and loss.num_crops == 8
    assert params.buffer_params.embedding_dim == 96
    assert params.buffer_params.world_size == 8
    assert params.buffer_params.effective_batch_size == 16 * 8 * 8
    assert loss.info_criterion.embedding_dim == 96


def test_infer_config_errors() -> None:
    cfg = _config(collator="simclr_collator")
    with pytest.raises(ConfigError, match="multicrop_collator") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.DATA.TRAIN.COLLATE_FUNCTION"
    cfg = _config(num_crops=6)
    with pytest.raises(ConfigError, match="total_num_crops=8") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.LOSS.multicrop_simclr_info_nce_loss.num_crops"


def _rank_embeddings(world_size: int, num_crops: int, b: int, dim: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234 + num_crops)
    return [torch.randn(num_crops * b, dim, generator=gen) for _ in range(world_size)]


def _distributed_worker(
    rank: int, world_size: int, num_crops: int, b: int, dim: int
) -> tuple[float, list, float, list]:
    per_rank = _rank_embeddings(world_size, num_crops, b, dim)
    emb = per_rank[rank].clone().requires_grad_(True)
    loss = _loss(num_crops, dim=dim)(emb, None)
    loss.backward()
    simclr_value, simclr_grad = float("nan"), []
    if num_crops == 2:
        emb2 = per_rank[rank].clone().requires_grad_(True)
        simclr = _simclr(dim=dim)(emb2, None)
        simclr.backward()
        simclr_value, simclr_grad = simclr.item(), emb2.grad.tolist()
    return loss.item(), emb.grad.tolist(), simclr_value, simclr_grad


def _global_batch(per_rank: list[torch.Tensor], num_crops: int, b: int) -> torch.Tensor:
    """The ranks' rows re-laid out crop-major over all ``world_size * b`` samples."""
    return torch.cat([e[k * b : (k + 1) * b] for k in range(num_crops) for e in per_rank])


@pytest.mark.parametrize("num_crops", [2, 5])
def test_two_processes_match_one_process_on_the_global_batch(num_crops: int) -> None:
    world_size, b, dim = 2, 3, 8
    results = spawn_gloo(_distributed_worker, world_size, num_crops, b, dim)
    per_rank = _rank_embeddings(world_size, num_crops, b, dim)

    # Every rank's loss is the naive formula, with every rank's rows as negatives.
    for rank, (value, _, simclr_value, simclr_grad) in enumerate(results):
        expected = naive_multicrop_nt_xent(per_rank, rank, num_crops, TEMPERATURE)
        assert value == pytest.approx(expected, rel=1e-5)
        if num_crops == 2:  # == SimCLR on 2 processes, loss and gradient
            assert value == pytest.approx(simclr_value, rel=1e-6)
            grad = torch.tensor(results[rank][1])
            assert torch.allclose(grad, torch.tensor(simclr_grad), rtol=1e-5, atol=1e-7)

    single_in = _global_batch(per_rank, num_crops, b).requires_grad_(True)
    single = _loss(num_crops, dim=dim)(single_in, None)
    single.backward()
    mean_of_ranks = sum(r[0] for r in results) / world_size
    assert mean_of_ranks == pytest.approx(single.item(), rel=1e-5)

    # Gradients flow back through the gather to each rank's slice: a rank's gradient is
    # d(sum_r loss_r)/d(its rows) = world_size * d(single)/d(those rows).
    grad = single_in.grad
    n = world_size * b
    for rank, (_, rank_grad, _, _) in enumerate(results):
        expected = torch.cat(
            [grad[k * n + rank * b : k * n + (rank + 1) * b] for k in range(num_crops)]
        )
        got = torch.tensor(rank_grad)
        assert torch.allclose(got, world_size * expected, atol=1e-5)
        assert got.abs().sum() > 0
