"""ibot_loss: the paper's formula written here in float64, the two centers (EMA of the
teacher's [CLS] and patch outputs, training only, over the global batch of 2 gloo ranks
with unequal batches), the per-epoch temperature schedules, config inference and errors,
and the state that checkpoints hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.ibot_loss import IBOTLoss, ibot_temperature
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.ibot_loss"
TAU_S, TAU_T, TAU_T2 = 0.1, 0.05, 0.07
G, LC, K, KP, L = 2, 2, 5, 4, 6  # global and local crops, widths, patches per crop


# ----------------------------------------------------------------------------- reference
def _softmax(x: list[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def _log_softmax(x: list[float]) -> list[float]:
    m = max(x)
    log_z = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - log_z for v in x]


def _ce(target_logits: list[float], center: list[float], tau_t: float, s: list[float]) -> float:
    p = _softmax([(t - c) / tau_t for t, c in zip(target_logits, center)])
    log_q = _log_softmax([v / TAU_S for v in s])
    return -sum(a * b for a, b in zip(p, log_q))


def ref_ibot(
    s_cls: torch.Tensor,
    s_patch: torch.Tensor,
    s_local: torch.Tensor | None,
    t_cls: torch.Tensor,
    t_patch: torch.Tensor,
    mask: torch.Tensor,
    center: torch.Tensor,
    center2: torch.Tensor,
    lambda1: float = 1.0,
    lambda2: float = 1.0,
) -> tuple[float, float]:
    """iBOT (Zhou et al. 2022, eq. 3 and the official code), loops in float64: the [CLS]
    term averages over pairs (teacher global crop q, student crop v != q) the mean over
    samples of the cross entropy; the patch term averages over the global crops q the mean
    over samples of the masked patches' mean cross entropy (0 without masked patches)."""
    s_cls, s_patch, t_cls, t_patch = (x.double().tolist() for x in (s_cls, s_patch, t_cls, t_patch))
    local = s_local.double().tolist() if s_local is not None else []
    m = mask.reshape(mask.shape[0], -1).tolist()
    c, c2 = center.double().reshape(-1).tolist(), center2.double().reshape(-1).tolist()
    b = len(s_cls) // G
    student = [s_cls[v * b : (v + 1) * b] for v in range(G)]
    student += [local[v * b : (v + 1) * b] for v in range(len(local) // b if local else 0)]
    cls_total, pairs = 0.0, 0
    for q in range(G):
        for v in range(len(student)):
            if v == q:
                continue
            cls_total += sum(_ce(t_cls[q * b + i], c, TAU_T, student[v][i]) for i in range(b)) / b
            pairs += 1
    patch_total = 0.0
    for q in range(G):
        crop = 0.0
        for i in range(b):
            row = q * b + i
            masked = [j for j in range(len(m[row])) if m[row][j]]
            ces = [_ce(t_patch[row][j], c2, TAU_T2, s_patch[row][j]) for j in masked]
            crop += sum(ces) / max(1, len(masked))
        patch_total += crop / b
    return lambda1 * cls_total / pairs, lambda2 * patch_total / G


def make_loss(**kw: Any) -> IBOTLoss:
    args: dict[str, Any] = dict(
        warmup_teacher_temp=TAU_T,
        teacher_temp=TAU_T,
        warmup_teacher_patch_temp=TAU_T2,
        teacher_patch_temp=TAU_T2,
        warmup_teacher_temp_epochs=0,
        student_temp=TAU_S,
        num_global_crops=G,
        num_local_crops=LC,
        out_dim=K,
        patch_out_dim=KP,
        num_epochs=10,
    )
    args.update(kw)
    loss = IBOTLoss(**args)
    loss.set_schedule_position(0, 0)
    return loss


def make_batch(b: int, seed: int, local: int = LC) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(G * b, 2, 3, generator=g) < 0.4
    mask[0] = False  # an image without masked patches adds 0 to its crop's mean
    return {
        "s_cls": torch.randn(G * b, K, generator=g),
        "s_patch": torch.randn(G * b, L, KP, generator=g),
        "s_local": torch.randn(local * b, K, generator=g) if local else None,
        "t_cls": torch.randn(G * b, K, generator=g),
        "t_patch": torch.randn(G * b, L, KP, generator=g),
        "mask": mask,
    }


def run(loss: IBOTLoss, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    teacher = [batch["t_cls"], batch["t_patch"]]
    output: list[Any] = [[batch["s_cls"], batch["s_patch"]]]
    if batch["s_local"] is not None:
        output.append([batch["s_local"]])
    else:  # the train step unwraps an output of one mapping entry
        output = output[0]
    return loss(output, batch["mask"], teacher_output=teacher)


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize("local", [LC, 0], ids=["2global+2local", "2global"])
def test_loss_matches_the_papers_formula(local: int) -> None:
    loss = make_loss(num_local_crops=local, lambda1=0.7, lambda2=1.3)
    torch.manual_seed(0)
    loss.center.copy_(torch.randn(1, K) * 0.3)  # non-zero centers are subtracted
    loss.center2.copy_(torch.randn(1, 1, KP) * 0.3)
    batch = make_batch(3, seed=1, local=local)
    cls, patch = ref_ibot(
        batch["s_cls"], batch["s_patch"], batch["s_local"], batch["t_cls"], batch["t_patch"],
        batch["mask"], loss.center, loss.center2, lambda1=0.7, lambda2=1.3,
    )  # fmt: skip
    got = run(loss, batch)
    assert got["cls"].item() == pytest.approx(cls, rel=1e-5)
    assert got["patch"].item() == pytest.approx(patch, rel=1e-5)
    assert got["loss"].item() == pytest.approx(cls + patch, rel=1e-5)


def test_gradient_reaches_the_student_and_only_its_masked_patches() -> None:
    loss = make_loss()
    batch = make_batch(2, seed=2)
    for key in ("s_cls", "s_patch", "s_local"):
        batch[key].requires_grad_(True)
    batch["t_patch"].requires_grad_(True)
    run(loss, batch)["loss"].backward()
    assert batch["s_cls"].grad.abs().sum() > 0 and batch["s_local"].grad.abs().sum() > 0
    grad = batch["s_patch"].grad.abs().sum(dim=-1)  # (G * B, L)
    flat = batch["mask"].reshape(grad.shape)
    assert torch.all(grad[~flat] == 0) and torch.all(grad[flat] > 0)
    assert batch["t_patch"].grad is None  # the targets are detached


def test_uniform_outputs_give_ln_widths() -> None:
    loss = make_loss()
    batch = make_batch(2, seed=3)
    for key in ("s_cls", "s_patch", "s_local", "t_cls", "t_patch"):
        batch[key] = torch.zeros_like(batch[key])
    batch["mask"][:] = True
    got = run(loss, batch)
    assert got["cls"].item() == pytest.approx(math.log(K), abs=1e-6)
    assert got["patch"].item() == pytest.approx(math.log(KP), abs=1e-6)


def test_a_call_without_the_teacher_output_says_how_to_pass_it() -> None:
    loss = make_loss()
    batch = make_batch(2, seed=4)
    run(loss, batch)
    with pytest.raises(TypeError, match="teacher_output="):
        loss([[batch["s_cls"], batch["s_patch"]], [batch["s_local"]]], batch["mask"])


# ----------------------------------------------------------------------------- centers
def test_centers_follow_the_teachers_mean_in_training_only_after_the_loss() -> None:
    loss = make_loss(center_momentum=0.8, center_momentum2=0.7)
    c0, c20 = torch.randn(1, K), torch.randn(1, 1, KP)
    loss.center.copy_(c0)
    loss.center2.copy_(c20)
    batch = make_batch(3, seed=5)
    expected = ref_ibot(
        batch["s_cls"], batch["s_patch"], batch["s_local"], batch["t_cls"], batch["t_patch"],
        batch["mask"], c0, c20,
    )  # fmt: skip
    got = run(loss, batch)  # the loss uses the centers of the previous steps
    assert got["cls"].item() == pytest.approx(expected[0], rel=1e-5)
    assert got["patch"].item() == pytest.approx(expected[1], rel=1e-5)
    cls_mean = batch["t_cls"].mean(dim=0, keepdim=True)
    patch_mean = batch["t_patch"].mean(dim=(0, 1)).reshape(1, 1, KP)  # every patch
    torch.testing.assert_close(loss.center, 0.8 * c0 + 0.2 * cls_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss.center2, 0.7 * c20 + 0.3 * patch_mean, rtol=0, atol=1e-6)
    loss.eval()
    before = (loss.center.clone(), loss.center2.clone())
    run(loss, make_batch(3, seed=6))
    assert torch.equal(loss.center, before[0]) and torch.equal(loss.center2, before[1])


def _rank_worker(rank: int, world: int, sizes: list[int]) -> tuple[list[float], list[float], float]:
    loss = make_loss()
    run(loss, make_batch(sizes[rank], seed=10 + rank))  # step 1 moves the centers
    second = run(loss, make_batch(sizes[rank], seed=20 + rank))["loss"]
    return loss.center.reshape(-1).tolist(), loss.center2.reshape(-1).tolist(), second.item()


def _cat(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """The global batch of per-rank batches, crop-major like the collator."""
    out: dict[str, Any] = {}
    for key in ("s_cls", "s_patch", "s_local", "t_cls", "t_patch", "mask"):
        crops = G if key != "s_local" else LC
        parts = [batch[key].chunk(crops) for batch in batches]
        out[key] = torch.cat([part[c] for c in range(crops) for part in parts])
    return out


@pytest.mark.parametrize("sizes", [[2, 3], [3, 3]], ids=["unequal", "equal"])
def test_two_ranks_share_the_centers_of_the_global_batch(sizes: list[int]) -> None:
    """2 gloo processes against 1 on the concatenated batch: the centers are the EMA of
    the mean over every rank's rows (weighted by the true counts); with equal batches the
    mean of the ranks' second-step losses is the loss of the global batch."""
    results = spawn_gloo(_rank_worker, 2, sizes)
    single = make_loss()
    run(single, _cat([make_batch(sizes[r], seed=10 + r) for r in range(2)]))
    second = run(single, _cat([make_batch(sizes[r], seed=20 + r) for r in range(2)]))["loss"]
    for center, center2, _ in results:
        assert center == pytest.approx(single.center.reshape(-1).tolist(), abs=1e-6)
        assert center2 == pytest.approx(single.center2.reshape(-1).tolist(), abs=1e-6)
    if sizes[0] == sizes[1]:
        mean = sum(r[2] for r in results) / 2
        assert mean == pytest.approx(second.item(), rel=1e-5)


# ----------------------------------------------------------------------------- schedules
def test_temperatures_follow_ibots_per_epoch_linspace() -> None:
    # np.linspace(0.04, 0.07, 4): epochs 0..3 step 0.01, then 0.07
    got = [ibot_temperature(e, 0.04, 0.07, 4) for e in range(6)]
    assert got == pytest.approx([0.04, 0.05, 0.06, 0.07, 0.07, 0.07])
    assert ibot_temperature(0, 0.04, 0.07, 1) == 0.04  # linspace of one value
    assert ibot_temperature(3, 0.04, 0.07, 0) == 0.07
    # the patch temperature waits for mim_start_epoch
    loss = make_loss(
        warmup_teacher_temp=0.02, teacher_temp=0.05, warmup_teacher_patch_temp=0.03,
        teacher_patch_temp=0.09, warmup_teacher_temp_epochs=4, mim_start_epoch=2,
    )  # fmt: skip
    temps = []
    for epoch in range(7):
        loss.set_schedule_position(100 * epoch, epoch)
        temps.append((loss.teacher_temp, loss.teacher_patch_temp))
    assert [t[0] for t in temps] == pytest.approx([0.02, 0.03, 0.04, 0.05, 0.05, 0.05, 0.05])
    assert [t[1] for t in temps] == pytest.approx([0.03, 0.03, 0.03, 0.05, 0.07, 0.09, 0.09])


def test_teacher_momentum_is_a_cosine_to_one() -> None:
    loss = make_loss(teacher_momentum=0.996)
    assert loss.teacher_momentum_at(0, 100) == pytest.approx(0.996)
    assert loss.teacher_momentum_at(50, 100) == pytest.approx(0.998)
    assert loss.teacher_momentum_at(100, 100) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- config
@pytest.fixture(scope="module")
def quick_cfg() -> AttrDict:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_ibot"])
    return cfg


def _clone(cfg: AttrDict) -> AttrDict:
    return AttrDict(cfg.to_dict())


def test_build_from_the_quick_config_infers_crops_widths_and_epochs(quick_cfg) -> None:
    loss = build_loss(quick_cfg.LOSS, quick_cfg)
    assert isinstance(loss, IBOTLoss)
    assert (loss.num_global_crops, loss.num_local_crops) == (2, 2)
    assert (loss.out_dim, loss.patch_out_dim, loss.num_epochs) == (64, 48, 2)
    assert loss.center.shape == (1, 64) and loss.center2.shape == (1, 1, 48)


@pytest.mark.parametrize(
    "path,value,match",
    [
        ("DATA.TRAIN.COLLATE_FUNCTION", "multicrop_collator", "COLLATE_FUNCTION"),
        ("DATA.TRAIN.TARGET_KEY_NAMES", ["label"], "TARGET_KEY_NAMES"),
        ("DATA.TRAIN.INPUT_KEY_NAMES", ["global_views"], "INPUT_KEY_NAMES"),
        (
            "MODEL.MULTI_INPUT_HEAD_MAPPING",
            [["global_views", {"feat_names": ["lastBLK"]}]],
            "MULTI_INPUT_HEAD_MAPPING",
        ),
        ("MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME", "mae", "NAME"),
        ("DATA.TRAIN.TRANSFORMS.5.patch_size", 8, r"TRANSFORMS\[5\].patch_size"),
        ("MODEL.HEAD.PARAMS", [["dino_head", {"in_dim": 32}]], "ibot_head"),
    ],
)
def test_config_errors_name_their_key(quick_cfg, path: str, value: Any, match: str) -> None:
    cfg = _clone(quick_cfg)
    *parents, last = path.split(".")
    node: Any = cfg
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[last] = value
    with pytest.raises(ConfigError, match=match):
        build_loss(cfg.LOSS, cfg)


@pytest.mark.parametrize(
    "key,value",
    [("student_temp", 0), ("center_momentum", 1.5), ("lambda2", -1), ("num_local_crops", -1)],
)
def test_bad_values_name_their_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{KEY}.{key}"):
        make_loss(**{key: value})


def test_unknown_key() -> None:
    with pytest.raises(ConfigError, match="no key"):
        IBOTLoss.from_config({"teacher_tmp": 0.04})


def test_state_dict_holds_the_teacher_and_both_centers(quick_cfg) -> None:
    from vissl.models import build_model

    model = build_model(quick_cfg.MODEL, quick_cfg.OPTIMIZER)
    loss = build_loss(quick_cfg.LOSS, quick_cfg)
    loss.bind_model(model)
    keys = set(loss.state_dict())
    assert {"center", "center2"} <= keys
    assert "teacher.trunk.patch_masking.masked_embed" in keys
    assert all(not p.requires_grad for p in loss.teacher.parameters())
    assert not loss.teacher.training  # no drop path in the teacher
