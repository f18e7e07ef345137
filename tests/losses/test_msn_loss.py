"""msn_loss against MSN's formula written out here (float64, one anchor at a time), with and
without label smoothing, Sinkhorn-Knopp and the entropy term, its gradients; 2 gloo
processes under DDP against one process on the global batch (Sinkhorn and the me-max over
the GLOBAL batch); the msn_head, the target encoder's shared prototypes and the config
inference's errors."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.msn_loss import MSNLoss
from vissl.models import build_model
from vissl.models.heads.msn_head import MSNHead
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

K = 6  # prototypes


def reference_targets(teacher: torch.Tensor, tau: float, tau_plus: float, s: float) -> list:
    """MSN's targets, one image at a time: the smoothed prediction at ``tau``, raised to
    ``tau / tau_plus`` (the sharpening ``T = tau_plus / tau``) and renormalised."""
    out = []
    for row in teacher.double():
        e = [math.exp(float(c) / tau) for c in row]
        q = [(1 - s) * v / sum(e) + s / len(e) for v in e]
        sharp = [v ** (tau / tau_plus) for v in q]
        out.append([v / sum(sharp) for v in sharp])
    return out


def reference_sinkhorn(targets: list, iters: int) -> list:
    """Sinkhorn-Knopp as in MSN: Q = targets^T (K x B) scaled to sum 1; per iteration the
    rows (prototypes) to 1/K each, the columns (images) to 1/B each; then times B."""
    b, k = len(targets), len(targets[0])
    q = [[targets[i][j] for i in range(b)] for j in range(k)]
    total = sum(map(sum, q))
    q = [[v / total for v in row] for row in q]
    for _ in range(iters):
        q = [[v / sum(row) / k for v in row] for row in q]
        cols = [sum(q[j][i] for j in range(k)) for i in range(b)]
        q = [[q[j][i] / cols[i] / b for i in range(b)] for j in range(k)]
    return [[q[j][i] * b for j in range(k)] for i in range(b)]


def reference_loss(
    anchors: torch.Tensor,
    teacher: torch.Tensor,
    tau: float = 0.1,
    tau_plus: float = 0.025,
    s: float = 0.0,
    sinkhorn: bool = False,
    me_max_weight: float = 1.0,
    entropy_weight: float = 0.0,
) -> float:
    """The paper's loss: the mean over anchors (view m of image i is row m * B + i) of the
    cross entropy H(p+_i, p_i,m), plus me_max_weight (log K - H(mean of the p's)), plus
    entropy_weight times the mean entropy of the p's."""
    b = teacher.shape[0]
    targets = reference_targets(teacher, tau, tau_plus, s)
    if sinkhorn:
        targets = reference_sinkhorn(targets, 3)
    probs = []
    for row in anchors.double():
        e = [math.exp(float(c) / tau) for c in row]
        probs.append([(1 - s) * v / sum(e) + s / len(e) for v in e])
    n = len(probs)
    ce = sum(-sum(t * math.log(p) for t, p in zip(targets[j % b], probs[j])) for j in range(n)) / n
    mean = [sum(p[k] for p in probs) / n for k in range(len(probs[0]))]
    me_max = math.log(len(mean)) + sum(m * math.log(m) for m in mean)
    ent = sum(-sum(v * math.log(v) for v in p) for p in probs) / n
    return ce + me_max_weight * me_max + entropy_weight * ent


def _cosines(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, K, generator=g) * 2 - 1


def _run(loss: MSNLoss, anchors: torch.Tensor | list, teacher: torch.Tensor) -> dict:
    return loss(anchors if isinstance(anchors, list) else [anchors], teacher_output=[teacher])


@pytest.mark.parametrize(
    ("kwargs", "ref"),
    [
        ({"use_sinkhorn": False}, {}),
        ({"use_sinkhorn": True}, {"sinkhorn": True}),
        (
            {"use_sinkhorn": True, "label_smoothing": 0.1, "entropy_weight": 0.5},
            {"sinkhorn": True, "s": 0.1, "entropy_weight": 0.5},
        ),
        (
            {"use_sinkhorn": False, "me_max_weight": 0.0, "temperature": 0.2},
            {"me_max_weight": 0.0, "tau": 0.2},
        ),
    ],
)
def test_loss_matches_the_papers_formula(kwargs: dict, ref: dict) -> None:
    b, views = 5, 3
    anchors, teacher = _cosines(views * b, 0), _cosines(b, 1)
    loss = MSNLoss(output_dim=K, **kwargs)
    # two mapped inputs (the masked anchors, then the focal views) are one anchor batch
    out = _run(loss, [anchors[:b], anchors[b:]], teacher)
    expected = reference_loss(anchors, teacher, **ref)
    assert float(out["loss"]) == pytest.approx(expected, rel=1e-5)
    parts = float(out["ce"] + out["me_max"] + out["entropy"])
    assert parts == pytest.approx(float(out["loss"]), rel=1e-6)
    if ref.get("me_max_weight", 1.0) == 0:
        assert float(out["me_max"]) == 0.0


def test_sharpened_target_is_the_softmax_at_the_target_temperature() -> None:
    """Without smoothing, sharpening softmax(c / 0.1) by T = 0.25 is softmax(c / 0.025)."""
    from vissl.losses.msn_loss import msn_targets

    teacher = _cosines(4, 3)
    got = msn_targets(teacher, 0.1, 0.025)
    torch.testing.assert_close(got, torch.softmax(teacher / 0.025, dim=1))
    assert got.max(dim=1).values.min() > torch.softmax(teacher / 0.1, dim=1).max(dim=1).values.min()


def test_gradient_matches_autograd_of_the_formula_and_reaches_only_the_anchors() -> None:
    b = 4
    anchors = _cosines(2 * b, 5).requires_grad_(True)
    teacher = _cosines(b, 6).requires_grad_(True)
    loss = MSNLoss(output_dim=K, use_sinkhorn=False, entropy_weight=0.3)
    _run(loss, anchors, teacher)["loss"].backward()
    assert teacher.grad is None  # the targets carry no gradient

    x = anchors.detach().double().requires_grad_(True)
    p = torch.softmax(x / 0.1, dim=1)
    t = torch.softmax(teacher.detach().double() / 0.025, dim=1).repeat(2, 1)
    ce = -(t * p.log()).sum(1).mean()
    mean = p.mean(0)
    ref = ce + (math.log(K) + (mean * mean.log()).sum()) + 0.3 * (-(p * p.log()).sum(1).mean())
    ref.backward()
    torch.testing.assert_close(anchors.grad.double(), x.grad, rtol=1e-4, atol=1e-7)


def test_me_max_is_zero_for_uniform_use_and_log_k_for_a_collapse() -> None:
    loss = MSNLoss(output_dim=K, use_sinkhorn=False)
    one_hot = torch.full((K, K), -1.0).fill_diagonal_(1.0)  # every prototype once
    assert float(_run(loss, one_hot, one_hot)["me_max"]) < 1e-3
    collapsed = torch.zeros(K, K)
    collapsed[:, 0] = 1.0
    collapsed[:, 1:] = -1.0
    assert float(_run(loss, collapsed, collapsed)["me_max"]) == pytest.approx(math.log(K), rel=1e-3)


# ----------------------------------------------------------------------------- 2 ranks
IN_DIM, OUT_DIM, B, VIEWS = 5, 4, 3, 3


def _model() -> nn.Module:
    """A head of the loss's shape: normalize(x W) @ normalize(prototypes).T."""

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(7)
            self.w = nn.Parameter(torch.randn(IN_DIM, OUT_DIM, generator=g))
            self.prototypes = nn.Parameter(torch.randn(K, OUT_DIM, generator=g))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.normalize(x @ self.w, dim=1) @ F.normalize(self.prototypes, dim=1).t()

    return Head()


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s anchors, view-major: (VIEWS * B, IN_DIM)."""
    return torch.randn(VIEWS * B, IN_DIM, generator=torch.Generator().manual_seed(20 + rank))


def _targets(rank: int) -> torch.Tensor:
    return _cosines(B, 40 + rank)


def _ddp_worker(rank: int, world: int) -> tuple:
    from torch.nn.parallel import DistributedDataParallel as DDP

    head = _model()
    model = DDP(head)
    loss = MSNLoss(output_dim=K, use_sinkhorn=True)
    out = _run(loss, model(_inputs(rank)), _targets(rank))
    out["loss"].backward()
    return (
        float(out["loss"]),
        float(out["me_max"]),
        head.w.grad.clone(),
        head.prototypes.grad.clone(),
    )


def _view_major_global(per_rank: list[torch.Tensor], views: int) -> torch.Tensor:
    chunks = [t.chunk(views) for t in per_rank]
    return torch.cat([chunks[r][v] for v in range(views) for r in range(len(per_rank))])


def test_two_ranks_under_ddp_match_one_process_on_the_global_batch() -> None:
    """The cross entropy is a per-rank mean (DDP averages it); Sinkhorn and the me-max
    use the global batch: the mean of the ranks' losses is the one-process loss, each
    rank's me-max is the global one, and DDP's gradients equal the one-process ones."""
    world = 2
    losses, me_maxes, w_grads, p_grads = zip(*spawn_gloo(_ddp_worker, world), strict=True)
    head = _model()
    x = _view_major_global([_inputs(r) for r in range(world)], VIEWS)
    teacher = torch.cat([_targets(r) for r in range(world)])
    anchors = head(x)
    single = _run(MSNLoss(output_dim=K, use_sinkhorn=True), anchors, teacher)
    single["loss"].backward()
    expected = reference_loss(anchors.detach(), teacher, sinkhorn=True)
    assert float(single["loss"].detach()) == pytest.approx(expected, rel=1e-5)
    assert sum(losses) / world == pytest.approx(float(single["loss"].detach()), rel=1e-5)
    for rank in range(world):
        assert me_maxes[rank] == pytest.approx(float(single["me_max"]), rel=1e-5)
        torch.testing.assert_close(w_grads[rank], head.w.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(p_grads[rank], head.prototypes.grad, rtol=1e-4, atol=1e-6)
    # control: a me-max over each rank's own anchors (averaged) gives another gradient
    local = _model()
    (sum(_local_me_max(local(_inputs(r))) for r in range(world)) / world).backward()
    single_me_max = _model()
    _local_me_max(single_me_max(x)).backward()
    assert not torch.allclose(local.w.grad, single_me_max.w.grad, atol=1e-4)


def _local_me_max(cosines: torch.Tensor) -> torch.Tensor:
    mean = torch.softmax(cosines / 0.1, dim=1).mean(0)
    return math.log(K) + (mean * mean.log()).sum()


# ----------------------------------------------------------------------------- head
def test_head_scores_cosines_in_float32_and_returns_the_query() -> None:
    torch.manual_seed(0)
    head = MSNHead({}, in_dim=8, num_prototypes=K, use_bn=True, hidden_dim=16, output_dim=4)
    assert [n for n, _ in head.fc.named_children()] == [
        "fc1", "bn1", "gelu1", "fc2", "bn2", "gelu2", "fc3",
    ]  # fmt: skip
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x)
    assert out.dtype == torch.float32 and out.shape == (5, K)
    assert out.abs().max() <= 1 + 1e-5
    head.return_query = True
    query = head(x)
    assert query.shape == (5, 4)
    torch.testing.assert_close(query.norm(dim=1), torch.ones(5))
    frozen = MSNHead({}, in_dim=8, num_prototypes=K, freeze_prototypes=True)
    assert not frozen.prototypes.requires_grad
    with pytest.raises(ConfigError, match="in_dim is 8 but its input has width 3"):
        head(torch.randn(2, 3))
    with pytest.raises(ConfigError, match="num_prototypes"):
        MSNHead({}, in_dim=8, num_prototypes=0)


# ----------------------------------------------------------------------------- config
@functools.cache
def _quick() -> AttrDict:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_msn"])
    return cfg


def quick_config() -> AttrDict:
    return copy.deepcopy(_quick())


def test_target_encoder_uses_the_models_prototypes_and_the_whole_target_view() -> None:
    cfg = quick_config()
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    assert loss.output_dim == 16  # from the msn_head
    loss.bind_model(model)
    with torch.no_grad():
        model.heads[0].prototypes.mul_(-2.0)
        model.trunk.pos_embed.add_(1.0)
    target = torch.randn(4, 3, 16, 16)
    out = loss.run_teacher({"target_views": target, "anchor_views": target[:0]})[0]
    teacher_head = loss.teacher.heads[0]
    assert torch.equal(teacher_head.prototypes, model.heads[0].prototypes)
    assert not torch.equal(loss.teacher.trunk.pos_embed, model.trunk.pos_embed)  # EMA only
    with torch.no_grad():
        feats = loss.teacher.trunk(target, ["lastCLS"])[0]
        torch.testing.assert_close(out, teacher_head(feats))


def focal_masking_config() -> AttrDict:
    """quick_msn as the focal-masking ablation (lightly's example; not MSN's code): the
    focal crops masked too, their masks listed and handed to the trunk."""
    cfg = quick_config()
    cfg.DATA.TRAIN.INPUT_KEY_NAMES = [*cfg.DATA.TRAIN.INPUT_KEY_NAMES, "focal_mask"]
    cfg.DATA.TRAIN.TRANSFORMS[-1].indices = [1, 2, 3]
    cfg.MODEL.MULTI_INPUT_HEAD_MAPPING[1][1]["additional_keys"] = {"mask": "focal_mask"}
    return cfg


def _anchor_and_focal_batch() -> dict[str, torch.Tensor]:
    anchors, focal = torch.randn(2, 3, 16, 16), torch.randn(4, 3, 8, 8)
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[:, :2] = True
    focal_mask = torch.tensor([[True, False], [False, True]]).expand(4, 2, 2)
    return {"anchor_views": anchors, "focal_views": focal, "mask": mask, "focal_mask": focal_mask}


def test_the_model_encodes_the_focal_views_whole_as_msn() -> None:
    """facebookresearch/msn ``src/deit.py`` drops patches of the first group of crops only
    (the 224 px rand_views): quick_msn masks the anchors and hands the focal views to the
    trunk without a mask (a ``focal_mask`` in the batch is not used)."""
    cfg = quick_config()
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    batch = _anchor_and_focal_batch()
    with torch.no_grad():
        out = model(batch)
        head, trunk = model.heads[0], model.trunk
        torch.testing.assert_close(out[1], head(trunk(batch["focal_views"], ["lastCLS"])[0]))
        anchors = head(trunk(batch["anchor_views"], ["lastCLS"], mask=batch["mask"])[0])
        torch.testing.assert_close(out[0], anchors)


def test_focal_masking_ablation_drops_the_masked_patches_of_the_focal_views() -> None:
    """The opt-in ablation: the config passes its checks and the model hands the focal
    views' masks (``focal_mask``) to the trunk as its ``mask``."""
    cfg = focal_masking_config()
    build_loss(cfg.LOSS, cfg)  # the layout checks accept it
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    batch = _anchor_and_focal_batch()
    focal, focal_mask = batch["focal_views"], batch["focal_mask"]
    with torch.no_grad():
        out = model(batch)
        head, trunk = model.heads[0], model.trunk
        masked = head(trunk(focal, ["lastCLS"], mask=focal_mask)[0])
        whole = head(trunk(focal, ["lastCLS"])[0])
        torch.testing.assert_close(out[1], masked)
        assert not torch.allclose(out[1], whole, atol=1e-4)
        torch.testing.assert_close(
            out[0], head(trunk(batch["anchor_views"], ["lastCLS"], mask=batch["mask"])[0])
        )


def test_focal_masking_half_configured_is_refused() -> None:
    """The three settings of the ablation go together: a mask the model would not use, or
    a key the batch would not have, is refused when the loss is built."""
    cfg = quick_config()
    cfg.DATA.TRAIN.TRANSFORMS[-1].indices = [1, 2, 3]  # masks the focal crops, unused
    with pytest.raises(ConfigError, match="masks focal crops, but focal_mask is not in") as e:
        build_loss(cfg.LOSS, cfg)
    assert e.value.key_path == "config.DATA.TRAIN.TRANSFORMS"
    cfg = focal_masking_config()
    cfg.DATA.TRAIN.TRANSFORMS[-1].indices = [1]  # the batch would have no focal_mask
    with pytest.raises(ConfigError, match="masks no focal crop, but focal_mask is in"):
        build_loss(cfg.LOSS, cfg)
    cfg = focal_masking_config()
    cfg.MODEL.MULTI_INPUT_HEAD_MAPPING[1][1] = {"feat_names": ["lastCLS"]}
    with pytest.raises(ConfigError, match="does not pass it to the trunk") as e:
        build_loss(cfg.LOSS, cfg)
    assert e.value.key_path == "config.MODEL.MULTI_INPUT_HEAD_MAPPING"
    cfg = focal_masking_config()
    cfg.DATA.TRAIN.INPUT_KEY_NAMES = ["target_views", "anchor_views", "focal_views", "mask"]
    with pytest.raises(ConfigError, match="focal_mask is not in .* passes it to the trunk"):
        build_loss(cfg.LOSS, cfg)


def test_vissl_head_keys_are_the_losss() -> None:
    cfg = quick_config()
    cfg.MODEL.HEAD.PARAMS[0][1]["temperature"] = 0.1  # VISSL's head key, the loss's value
    cfg.MODEL.HEAD.PARAMS[0][1]["label_smoothing"] = 0.0
    assert build_loss(cfg.LOSS, cfg).temperature == 0.1
    build_model(cfg.MODEL, cfg.OPTIMIZER)  # the head accepts them
    cfg.MODEL.HEAD.PARAMS[0][1]["temperature"] = 0.2
    with pytest.raises(ConfigError, match=r"msn_head's temperature .* is 0.2 but"):
        build_loss(cfg.LOSS, cfg)


def test_config_inference_names_the_wrong_key() -> None:
    cases = [
        ("DATA.TRAIN.COLLATE_FUNCTION", "multicrop_collator", "COLLATE_FUNCTION: msn_collator"),
        ("DATA.TRAIN.INPUT_KEY_NAMES", ["anchor_views", "mask"], "INPUT_KEY_NAMES must list"),
        (
            "MODEL.MULTI_INPUT_HEAD_MAPPING",
            [["anchor_views", {"feat_names": ["lastCLS"]}]],
            "MULTI_INPUT_HEAD_MAPPING must be",
        ),
        (
            "MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME",
            "ibot",
            "MASKED_IMAGE_MODELING.NAME: mae",
        ),
    ]
    for path, value, message in cases:
        cfg = quick_config()
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        with pytest.raises(ConfigError, match=message):
            build_loss(cfg.LOSS, cfg)
    cfg = quick_config()  # VISSL's layout: the crops as one input, no mapping
    cfg.DATA.TRAIN.COLLATE_FUNCTION = "multicrop_collator"
    cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME = "msn"
    with pytest.raises(ConfigError, match="leave config.DATA.TRAIN.INPUT_KEY_NAMES at"):
        build_loss(cfg.LOSS, cfg)
    cfg = quick_config()
    cfg.DATA.TRAIN.TRANSFORMS[-1].patch_size = 8
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[5\].patch_size is 8"):
        build_loss(cfg.LOSS, cfg)
    cfg = quick_config()
    cfg.LOSS.msn_loss.target_temperature = 0
    with pytest.raises(ConfigError, match="msn_loss.target_temperature must be a number > 0"):
        build_loss(cfg.LOSS, cfg)
    with pytest.raises(ConfigError, match="no key"):
        MSNLoss.from_config({"sharpen": 0.25})
