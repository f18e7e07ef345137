"""moco_v3_loss: the paper's formula written here from its Algorithm 1 (Chen, Xie, He
2021), the gradient reaching the queries only, 2 gloo processes against one process on
the concatenated batch (loss value, parameter gradients, and the factor W on the
gradients of a rank's own predictions), the momentum encoder (the model less its
predictor, its keys on both views, the cosine momentum schedule), config errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.moco_v3_loss import MoCoV3Loss
from vissl.losses.predictor_common import MomentumTargetHook
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.moco_v3_loss"


# ----------------------------------------------------------------------------- reference
def ref_ctr(q: torch.Tensor, k: torch.Tensor, tau: float) -> torch.Tensor:
    """The paper's ``ctr(q, k)`` in float64, one query at a time:

        logits = mm(q, k.t()); labels = range(N)
        return 2 * tau * CrossEntropyLoss(logits / tau, labels)

    with ``q`` and ``k`` L2-normalised; CrossEntropyLoss averages over the N queries."""
    n = q.shape[0]
    qn = [row.double() / torch.sqrt((row.double() ** 2).sum()) for row in q]
    kn = [row.double() / torch.sqrt((row.double() ** 2).sum()) for row in k]
    total = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        logits = torch.stack([qn[i] @ kn[j] / tau for j in range(n)])
        total = total - (logits[i] - torch.logsumexp(logits, dim=0))
    return 2 * tau * total / n


def ref_moco_v3(p: torch.Tensor, keys: torch.Tensor, tau: float) -> torch.Tensor:
    """``ctr(q1, k2) + ctr(q2, k1)`` of a view-major batch (rows ``0..N-1`` view 1)."""
    n = p.shape[0] // 2
    k = keys.detach()
    return ref_ctr(p[:n], k[n:], tau) + ref_ctr(p[n:], k[:n], tau)


class _TinyModel(nn.Module):
    """trunk + [projector, predictor] heads, chained, like the base model (no BatchNorm:
    2 ranks and one process compute the same outputs)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Linear(5, 6)
        self.heads = nn.ModuleList(
            [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8)), nn.Linear(8, 8)]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.trunk(x)
        for head in self.heads:
            out = head(out)
        return [out]


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize("tau", [0.2, 1.0])
def test_matches_the_papers_formula_and_gradients(tau: float) -> None:
    torch.manual_seed(0)
    loss = MoCoV3Loss(temperature=tau, embedding_dim=8)
    p = torch.randn(10, 8, requires_grad=True)
    k = torch.randn(10, 8)
    value = loss(p, teacher_output=k)
    value.backward()
    assert p.grad is not None
    grad = p.grad.clone()
    p.grad = None
    ref = ref_moco_v3(p, k, tau)
    ref.backward()
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(grad, p.grad.float(), rtol=1e-4, atol=1e-7)


def test_the_scale_is_2_tau_times_the_cross_entropy() -> None:
    """Orthogonal queries and keys (every logit 0 but the positive's, 1 / tau): the
    cross entropy is known in closed form, times 2 tau, twice (both directions)."""
    n, tau = 4, 0.5
    loss = MoCoV3Loss(temperature=tau, embedding_dim=n)
    eye = torch.eye(n)
    ce = -(1 / tau - math.log(math.exp(1 / tau) + n - 1))
    assert loss(
        torch.cat([eye, eye]), teacher_output=torch.cat([eye, eye])
    ).item() == pytest.approx(2 * (2 * tau * ce), rel=1e-6)


def test_the_gradient_reaches_the_queries_only() -> None:
    loss = MoCoV3Loss(embedding_dim=8)
    p = torch.randn(6, 8, requires_grad=True)
    k = torch.randn(6, 8, requires_grad=True)
    loss([p], teacher_output=k).backward()
    assert p.grad is not None and p.grad.abs().sum() > 0
    assert k.grad is None


def test_a_bf16_autocast_still_computes_in_fp32() -> None:
    torch.manual_seed(1)
    loss = MoCoV3Loss(embedding_dim=8)
    p = torch.randn(8, 8)
    k = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(p.bfloat16(), teacher_output=k.bfloat16())
    assert value.dtype == torch.float32
    ref = ref_moco_v3(p.bfloat16().float(), k.bfloat16().float(), 0.2)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)


def test_missing_keys_and_wrong_widths_are_explained() -> None:
    loss = MoCoV3Loss(embedding_dim=8)
    with pytest.raises(TypeError, match="teacher_output="):
        loss(torch.randn(4, 8))
    with pytest.raises(ConfigError, match="embedding_dim is 8"):
        loss(torch.randn(4, 6), teacher_output=torch.randn(4, 6))
    with pytest.raises(ValueError, match="keys of shape"):
        loss(torch.randn(4, 8), teacher_output=torch.randn(6, 8))


# ----------------------------------------------------------------------------- 2 ranks
WORLD, B, TAU = 2, 3, 0.2


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s (2 * B, 5) inputs, view-major."""
    g = torch.Generator().manual_seed(40 + rank)
    x1 = torch.randn(B, 5, generator=g)
    return torch.cat([x1, x1 + 0.3 * torch.randn(B, 5, generator=g)])


def _global_batch() -> torch.Tensor:
    """The 2 ranks' samples as one view-major batch: view 1 of rank 0, of rank 1, then
    view 2 of rank 0, of rank 1 (the positive of global query i is global key i)."""
    per_rank = [_inputs(r) for r in range(WORLD)]
    return torch.cat([x[:B] for x in per_rank] + [x[B:] for x in per_rank])


def _ddp_worker(rank: int, world: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _TinyModel(seed=11)
    loss = MoCoV3Loss(temperature=TAU, embedding_dim=8)
    loss.bind_model(model)
    assert loss.target_network is not None
    x = _inputs(rank)
    with torch.no_grad():
        keys = loss.target_network(x)[0]
    ddp = DDP(model)
    prediction = ddp(x)[0]
    prediction.retain_grad()
    value = loss(prediction, teacher_output=keys)
    value.backward()
    assert prediction.grad is not None
    return {
        "loss": value.item(),
        "grads": {n: q.grad.clone() for n, q in model.named_parameters()},
        "prediction_grad": prediction.grad.clone(),
    }


def test_two_ranks_match_one_process_on_the_concatenated_batch() -> None:
    """Each rank scores its B queries against the keys of both ranks (gathered).

    - value: the mean of the ranks' losses is the one-process loss of the global batch
      (each is a mean over its queries, all against the same N = W * B keys);
    - parameter gradients: DDP's average of the ranks' gradients is the one-process
      gradient, exactly (no factor);
    - gradients w.r.t. the predictions: a rank's loss is a mean over B queries, the
      one-process loss over W * B, so the gradient a rank sends to its own predictions is
      W times the one-process gradient of those rows (DDP's 1 / W undoes it).
    """
    results = spawn_gloo(_ddp_worker, WORLD)
    model = _TinyModel(seed=11)
    loss = MoCoV3Loss(temperature=TAU, embedding_dim=8)
    loss.bind_model(model)
    assert loss.target_network is not None
    x = _global_batch()
    with torch.no_grad():
        keys = loss.target_network(x)[0]
    prediction = model(x)[0]
    prediction.retain_grad()
    ref = ref_moco_v3(prediction, keys, TAU)
    ref.backward()
    assert prediction.grad is not None

    mean = sum(r["loss"] for r in results) / WORLD
    assert mean == pytest.approx(ref.item(), rel=1e-5)
    assert results[0]["loss"] != pytest.approx(results[1]["loss"], rel=1e-3)
    for n, q in model.named_parameters():
        for r in results:
            torch.testing.assert_close(r["grads"][n], q.grad.float(), rtol=1e-4, atol=1e-6)
    # a gradient far above atol: a factor W (or 1 / W) would fail the comparison
    assert model.heads[1].weight.grad.abs().max() > 1000 * 1e-6
    one = prediction.grad.float()
    for rank, r in enumerate(results):
        rows = torch.cat([one[rank * B : (rank + 1) * B], one[(WORLD + rank) * B :][:B]])
        torch.testing.assert_close(r["prediction_grad"], WORLD * rows, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------- encoder
def test_momentum_encoder_lacks_the_predictor_and_gives_the_keys_of_both_views() -> None:
    model = _TinyModel(seed=2)
    loss = MoCoV3Loss(embedding_dim=8)
    loss.bind_model(model)
    target = loss.target_network
    assert target is not None and len(target.heads) == 1
    assert all(not q.requires_grad for q in target.parameters())
    hook = MomentumTargetHook(loss)
    x = torch.randn(6, 5)
    task = AttrDict(
        iteration=0,
        train_phase_idx=0,
        train=True,
        last_batch=AttrDict(sample={"input": x}, loss_inputs={}),
        precision=AttrDict(autocast=lambda: torch.autocast("cpu", enabled=False)),
    )
    hook.on_forward(task)  # type: ignore[arg-type]
    with torch.no_grad():
        projection = model.heads[0](model.trunk(x))  # the model's output before its predictor
    keys = task.last_batch.loss_inputs["teacher_output"]
    assert not keys.requires_grad
    torch.testing.assert_close(keys, projection)


def test_momentum_encoder_follows_the_model_by_the_cosine_schedule() -> None:
    model = _TinyModel(seed=3)
    loss = MoCoV3Loss(momentum=0.9, embedding_dim=8)
    loss.bind_model(model)
    target = loss.target_network
    assert target is not None
    hook = MomentumTargetHook(loss)
    source = dict(model.named_parameters())
    for iteration, max_iteration in ((0, 20), (5, 20), (20, 20)):
        before = {n: q.clone() for n, q in target.named_parameters()}
        with torch.no_grad():
            for q in model.parameters():
                q.add_(1.0)
        task = AttrDict(iteration=iteration, max_iteration=max_iteration, base_model=model)
        hook.on_update(task)  # type: ignore[arg-type]
        # MoCo v3's --moco-m-cos: m = 1 - (1 - m0) * (cos(pi * k / K) + 1) / 2
        m = 1 - 0.5 * (1 + math.cos(math.pi * iteration / max_iteration)) * (1 - 0.9)
        assert hook.last_momentum == pytest.approx(m)
        for n, q in target.named_parameters():
            torch.testing.assert_close(q, m * before[n] + (1 - m) * source[n])
    assert hook.last_momentum == 1.0  # the last update keeps the encoder
    assert "heads.1.weight" in source and "heads.1.weight" not in dict(target.named_parameters())


# ----------------------------------------------------------------------------- config
def _config(*overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_moco_v3", *overrides])
    return cfg


def test_quick_config_builds_and_infers_the_width() -> None:
    cfg = _config("config.LOSS.moco_v3_loss.embedding_dim=5")
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, MoCoV3Loss)
    assert (loss.embedding_dim, loss.temperature, loss.momentum) == (32, 1.0, 0.99)


def test_defaults_apply_when_the_section_is_left_out() -> None:
    cfg = _config("~config.LOSS.moco_v3_loss")
    loss = build_loss(cfg.LOSS, cfg)
    assert (loss.temperature, loss.momentum, loss.embedding_dim) == (0.2, 0.99, 32)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}]]", "projector and a predictor"),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[32,16]}]]",
            "widths must match",
        ),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[16,32]}]]",
            "input width 16",
        ),
        ("config.DATA.TRAIN.TRANSFORMS.0.num_times=3", "exactly 2 views"),
    ],
)
def test_config_mistakes_are_config_errors(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = _config(override)
        build_loss(cfg.LOSS, cfg)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", 0),
        ("temperature", -0.1),
        ("temperature", "a"),
        ("temperature", True),
        ("momentum", -0.1),
        ("momentum", 1.5),
        ("momentum", "a"),
        ("embedding_dim", 0),
        ("embedding_dim", 2.5),
        ("embedding_dim", True),
    ],
)
def test_bad_values_name_their_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        build_loss(AttrDict(name="moco_v3_loss", moco_v3_loss={key: value}))
    assert err.value.key_path == f"{KEY}.{key}"
