"""``GradClipHook``'s modes (``MODEL.GRAD_CLIP.MODE``), each against a rule written out here:

- ``global`` (VISSL): every gradient scaled by ``min(1, max / (||all|| + 1e-6))``;
- ``per_parameter`` (facebookresearch/dino and bytedance/ibot ``utils.clip_gradients``):
  ``clip_coef = max / (||g|| + 1e-6)``, applied to that gradient only when below 1;
- ``per_module`` (facebookresearch/dinov2 ``train.py``: ``clip_grad_norm_`` per student
  submodule): one norm per named submodule;
- ``EXCLUDE_PARAMS`` (facebookresearch/msn ``msn_train.py``: ``clip_grad_norm_`` over
  ``encoder.parameters()``, not the prototypes).

The recipes carry their authors' mode, and FSDP2's sharded gradients are clipped by their
whole norm (2 gloo processes against 1, slow).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.hooks.grad_clip_hooks import GradClipHook, default_clip_modules
from vissl.hooks.state_update_hooks import FreezeParametersHook
from vissl.trainer.precision import Precision
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo


class _Model(nn.Module):
    """Our model's layout: ``trunk`` and ``heads`` (a ModuleList)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 3)
        self.heads = nn.ModuleList([nn.Linear(3, 2), nn.Linear(3, 5, bias=False)])


def _task(model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(base_model=model, precision=Precision(), optimizer=None)


def _grads_of_norm(model: nn.Module, norms: dict[str, float], seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        grad = torch.randn(p.shape, generator=g)
        p.grad = grad * (norms[name] / grad.norm()) if name in norms else grad


def _clone_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _clip(model: nn.Module, **kwargs: Any) -> dict[str, torch.Tensor]:
    GradClipHook(**kwargs).on_backward(_task(model))  # type: ignore[arg-type]
    return _clone_grads(model)


# ---------------------------------------------------------------------- the rules
def _two_parameters() -> nn.Module:
    model = nn.Module()
    model.a = nn.Parameter(torch.zeros(6))
    model.b = nn.Parameter(torch.zeros(3, 2))
    _grads_of_norm(model, {"a": 10.0, "b": 1.0})
    return model


def test_per_parameter_rescales_only_the_gradient_above_max_norm() -> None:
    model = _two_parameters()
    before = _clone_grads(model)
    after = _clip(model, max_norm=3.0, mode="per_parameter")
    # DINO's rule: clip_coef = 3 / (10 + 1e-6) < 1 for a; 3 / (1 + 1e-6) >= 1 for b
    torch.testing.assert_close(after["a"], before["a"] * (3.0 / (10.0 + 1e-6)))
    assert after["a"].norm().item() == pytest.approx(3.0, rel=1e-5)
    assert torch.equal(after["b"], before["b"])


def test_global_rescales_both_by_max_norm_over_the_total_norm() -> None:
    model = _two_parameters()
    before = _clone_grads(model)
    after = _clip(model, max_norm=3.0)
    factor = 3.0 / (math.sqrt(101.0) + 1e-6)
    for name in ("a", "b"):
        torch.testing.assert_close(after[name], before[name] * factor)


@pytest.mark.parametrize("norm_type", [1, "inf"])
def test_per_parameter_with_other_norms(norm_type: Any) -> None:
    model = _two_parameters()
    before = _clone_grads(model)
    after = _clip(model, max_norm=0.5, mode="per_parameter", norm_type=norm_type)
    p = math.inf if norm_type == "inf" else 1.0
    for name, grad in before.items():
        norm = torch.linalg.vector_norm(grad, ord=p).item()
        expected = grad * min(1.0, 0.5 / (norm + 1e-6))
        torch.testing.assert_close(after[name], expected)


def test_per_module_computes_one_norm_per_module() -> None:
    model = _Model()
    _grads_of_norm(model, {"trunk.weight": 4.0, "trunk.bias": 3.0, "heads.1.weight": 0.5})
    before = _clone_grads(model)
    after = _clip(model, max_norm=2.0, mode="per_module")  # default: trunk, heads.0, heads.1
    for module in ("trunk", "heads.0", "heads.1"):
        names = [n for n in before if n.startswith(f"{module}.")]
        norm = torch.linalg.vector_norm(torch.cat([before[n].flatten() for n in names])).item()
        factor = min(1.0, 2.0 / (norm + 1e-6))
        for n in names:
            torch.testing.assert_close(after[n], before[n] * factor)
    assert torch.equal(after["heads.1.weight"], before["heads.1.weight"])  # 0.5 < 2


def test_per_module_with_named_modules_and_ddp_prefix() -> None:
    model = _Model()
    _grads_of_norm(model, {})
    before = _clone_grads(model)
    after = _clip(model, max_norm=0.1, mode="per_module", modules=["module.trunk", "heads"])
    for module in ("trunk", "heads"):
        names = [n for n in before if n.startswith(f"{module}.")]
        norm = torch.linalg.vector_norm(torch.cat([before[n].flatten() for n in names])).item()
        for n in names:
            torch.testing.assert_close(after[n], before[n] * (0.1 / (norm + 1e-6)))


@pytest.mark.parametrize("mode", ["global", "per_parameter"])
def test_excluded_parameters_are_neither_counted_nor_scaled(mode: str) -> None:
    model = _Model()
    _grads_of_norm(model, {"heads.1.weight": 100.0})
    before = _clone_grads(model)
    after = _clip(model, max_norm=0.2, mode=mode, exclude_params=["heads.1"])
    assert torch.equal(after["heads.1.weight"], before["heads.1.weight"])
    rest = [n for n in before if not n.startswith("heads.1")]
    total = torch.linalg.vector_norm(torch.cat([before[n].flatten() for n in rest])).item()
    for n in rest:
        norm = total if mode == "global" else before[n].norm().item()
        torch.testing.assert_close(after[n], before[n] * min(1.0, 0.2 / (norm + 1e-6)))


def test_gradients_set_to_none_are_skipped_and_the_sets_follow() -> None:
    """A frozen layer's gradient is None for some steps (TEMP_FROZEN_PARAMS_ITER_MAP): the
    module's norm is then that of the others, and counts it again once it is back."""
    model = _Model()
    hook = GradClipHook(max_norm=0.3, mode="per_module")
    task = _task(model)
    for frozen in (True, False, True):
        _grads_of_norm(model, {})
        if frozen:
            model.heads[0].weight.grad = None
        before = _clone_grads(model)
        hook.on_backward(task)  # type: ignore[arg-type]
        names = [n for n in before if n.startswith("heads.0.")]
        norm = torch.linalg.vector_norm(torch.cat([before[n].flatten() for n in names])).item()
        for n in names:
            torch.testing.assert_close(model.get_parameter(n).grad, before[n] * (0.3 / norm))
        assert (model.heads[0].weight.grad is None) == frozen


def test_the_sets_are_built_once_not_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Model()
    hook = GradClipHook(max_norm=0.3, mode="per_module")
    task = _task(model)
    hook.on_phase_start(task)  # type: ignore[arg-type]
    calls: list[str] = []
    counting = [False]
    for attr in ("parameters", "named_parameters", "modules", "named_modules", "children"):
        original = getattr(model, attr)

        def counted(*a: Any, _o: Any = original, _n: str = attr, **k: Any) -> Any:
            if counting[0]:
                calls.append(_n)
            return _o(*a, **k)

        monkeypatch.setattr(model, attr, counted)
    for _ in range(3):
        _grads_of_norm(model, {})
        counting[0] = True
        hook.on_backward(task)  # type: ignore[arg-type]
        counting[0] = False
    assert calls == []
    # another model (the task's model replaced): the sets are rebuilt for it
    other = _Model()
    _grads_of_norm(other, {"trunk.weight": 9.0})
    hook.on_backward(_task(other))  # type: ignore[arg-type]
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in other.trunk.parameters()]))
    assert norm.item() == pytest.approx(0.3, rel=1e-5)


@pytest.mark.parametrize("mode", ["per_parameter", "per_module"])
def test_no_value_is_read_back_to_the_host(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The norms and the scaling stay tensors (on CUDA a read would sync each step; the
    CUDA suite counts syncs, tests/gpu/test_cuda_host_syncs.py)."""
    model = _Model()
    hook = GradClipHook(max_norm=0.3, mode=mode)
    task = _task(model)
    hook.on_backward(task)  # type: ignore[arg-type]  # (no gradients yet: nothing to do)
    _grads_of_norm(model, {"trunk.weight": 5.0})
    before = _clone_grads(model)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a tensor value was read on the host")

    for method in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, method, refuse)
    hook.on_backward(task)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert not torch.equal(model.trunk.weight.grad, before["trunk.weight"])  # it clipped


def test_unscales_first_under_fp16() -> None:
    calls: list[str] = []

    class _Scaler(Precision):
        def unscale_(self, optimizer: Any) -> None:
            calls.append("unscale")
            for p in model.parameters():
                p.grad.div_(1024.0)

    model = _two_parameters()
    before = _clone_grads(model)
    task = SimpleNamespace(base_model=model, precision=_Scaler(), optimizer=None)
    GradClipHook(max_norm=3.0, mode="per_parameter").on_backward(task)  # type: ignore[arg-type]
    assert calls == ["unscale"]
    # unscaled norms 10/1024 and 1/1024 are below 3: nothing clipped after the unscale
    for name, grad in before.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad / 1024.0)


# ---------------------------------------------------------------------- refusals
def test_bad_values_are_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match=r"MODEL\.GRAD_CLIP\.MODE='per_layer'.*per_parameter"):
        GradClipHook(mode="per_layer")
    with pytest.raises(ConfigError, match=r"GRAD_CLIP\.MAX_NORM=0 must be a positive"):
        GradClipHook(max_norm=0)
    with pytest.raises(ConfigError, match=r"GRAD_CLIP\.NORM_TYPE=-1"):
        GradClipHook(norm_type=-1)
    with pytest.raises(ConfigError, match=r"GRAD_CLIP\.MODULES=\['trunk'\] is read by MODE"):
        GradClipHook(mode="global", modules=["trunk"])
    with pytest.raises(ConfigError, match=r"GRAD_CLIP\.EXCLUDE_PARAMS='prototypes' must be a"):
        GradClipHook(exclude_params="prototypes")  # type: ignore[arg-type]


def test_a_module_or_pattern_matching_nothing_is_refused_at_start() -> None:
    task = _task(_Model())
    hook = GradClipHook(mode="per_module", modules=["trunk", "head"])
    with pytest.raises(ConfigError, match=r"MODULES: 'head' is not a submodule.*'heads\.0'") as e:
        hook.on_start(task)  # type: ignore[arg-type]
    assert e.value.key_path == "config.MODEL.GRAD_CLIP.MODULES"
    hook = GradClipHook(exclude_params=["prototypes"])
    with pytest.raises(ConfigError, match=r"EXCLUDE_PARAMS: \['prototypes'\] matches no") as e:
        hook.on_start(task)  # type: ignore[arg-type]
    assert e.value.key_path == "config.MODEL.GRAD_CLIP.EXCLUDE_PARAMS"
    hook = GradClipHook(mode="per_module", modules=["trunk"])
    with pytest.raises(ConfigError, match=r"leaves 3 trainable parameters unclipped"):
        hook.on_start(task)  # type: ignore[arg-type]
    hook = GradClipHook(mode="per_module", modules=["heads", "heads.0", "trunk"])
    with pytest.raises(ConfigError, match=r"\['heads', 'heads\.0'\] overlap"):
        hook.on_start(task)  # type: ignore[arg-type]
    hook = GradClipHook(mode="per_module", modules=["trunk", "heads"], exclude_params=["heads"])
    with pytest.raises(ConfigError, match=r"\['heads'\] hold no clipped parameter"):
        hook.on_start(task)  # type: ignore[arg-type]


def test_an_unknown_mode_in_config_is_refused_at_validation() -> None:
    with pytest.raises(ConfigError, match=r"config\.MODEL\.GRAD_CLIP\.MODE='layer'.*per_module"):
        hydra_compose_and_validate(["config=test/integration_test/quick_dino",
                                    "config.MODEL.GRAD_CLIP.MODE=layer"])  # fmt: skip


def test_default_modules_are_the_trunk_and_each_head() -> None:
    assert default_clip_modules(_Model()) == ["trunk", "heads.0", "heads.1"]


def test_default_hooks_clip_before_the_frozen_layer_is_dropped_except_in_global_mode() -> None:
    """DINO / iBOT clip, then cancel the last layer's gradient; DINOv2's frozen last layer
    (lr 0) still counts in its head's norm. VISSL drops it first, then clips."""
    for mode, clip_first in (("per_module", True), ("per_parameter", True), ("global", False)):
        _, cfg = hydra_compose_and_validate(
            [
                "config=test/integration_test/quick_dino",
                f"config.MODEL.GRAD_CLIP.MODE={mode}",
                "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
            ]
        )
        types = [type(h) for h in default_hook_generator(cfg)]
        clip, freeze = types.index(GradClipHook), types.index(FreezeParametersHook)
        assert (clip < freeze) == clip_first, mode


# ---------------------------------------------------------------------- the recipes
# config -> (MODE, MODULES, EXCLUDE_PARAMS); the max norm is 3.0 in every one
RECIPES = {
    # facebookresearch/dino main_dino.py --clip_grad 3.0 (utils.clip_gradients)
    "pretrain/dino/dino_8gpu_vits16": ("per_parameter", [], []),
    "pretrain/dino/dino_64gpu_vits16": ("per_parameter", [], []),
    "pretrain/dino/dino_8gpu_resnet50": ("per_parameter", [], []),
    "digits/dino_vit": ("per_parameter", [], []),
    # bytedance/ibot main_ibot.py --clip_grad 3.0 (utils.clip_gradients)
    "pretrain/ibot/ibot_8gpu_vits16": ("per_parameter", [], []),
    "pretrain/ibot/ibot_8gpu_vitb16": ("per_parameter", [], []),
    "digits/ibot": ("per_parameter", [], []),
    # facebookresearch/dinov2 ssl_default_config.yaml optim.clip_grad 3.0, train.py
    "pretrain/dinov2/dinov2_8gpu_vits16": ("per_module", ["trunk", "heads.0"], []),
    "pretrain/dinov2/dinov2_8gpu_vitb16": ("per_module", ["trunk", "heads.0"], []),
    "digits/dinov2": ("per_module", ["trunk", "heads.0"], []),
    # facebookresearch/msn configs/pretrain/msn_vits16.yaml clip_grad 3.0, encoder only
    "pretrain/msn/msn_8gpu_vits16": ("global", [], ["prototypes"]),
    "pretrain/msn/msn_8gpu_vitb16": ("global", [], ["prototypes"]),
    "digits/msn": ("global", [], ["prototypes"]),
}
# MAE (main_pretrain.py: NativeScaler with clip_grad None), I-JEPA (train.py: no clipping),
# DINO's large-batch ResNet-50 (clip_grad 0)
NO_CLIP = [
    "pretrain/mae/mae_8gpu_vits16",
    "pretrain/mae/mae_8gpu_vitb16",
    "pretrain/ijepa/ijepa_8gpu_vits16",
    "pretrain/ijepa/ijepa_8gpu_vitb16",
    "pretrain/dino/dino_64gpu_resnet50",
    "digits/mae",
    "digits/ijepa",
]


def _compose(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hydra_compose_and_validate([f"config={name}", "config.MACHINE.DEVICE=cpu"])[1]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_clip_as_their_authors(name: str) -> None:
    clip = _compose(name).MODEL.GRAD_CLIP
    mode, modules, exclude = RECIPES[name]
    assert clip.USE_GRAD_CLIP is True
    assert (clip.MODE, list(clip.MODULES), list(clip.EXCLUDE_PARAMS)) == (mode, modules, exclude)
    assert clip.MAX_NORM == 3.0 and clip.NORM_TYPE == 2
    hook = GradClipHook.from_config(clip)
    assert (hook.mode, hook.max_norm) == (mode, 3.0)


@pytest.mark.parametrize("name", NO_CLIP)
def test_recipes_whose_authors_do_not_clip_do_not(name: str) -> None:
    assert _compose(name).MODEL.GRAD_CLIP.USE_GRAD_CLIP is False


@pytest.mark.parametrize("name", ["digits/dinov2", "digits/msn", "digits/ibot"])
def test_digits_recipes_sets_fit_their_model(name: str) -> None:
    """The recipe's MODULES / EXCLUDE_PARAMS name what the built model has: DINOv2's sets
    cover every parameter, MSN leaves out exactly the prototypes."""
    from vissl.models import build_model

    cfg = _compose(name)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    hook = GradClipHook.from_config(cfg.MODEL.GRAD_CLIP)
    hook.build(model)
    assert hook._plan is not None
    left_out = {n for n, _ in model.named_parameters()} - set(hook._plan.names)
    assert left_out == ({"heads.0.prototypes"} if name == "digits/msn" else set())


# ---------------------------------------------------------------------- FSDP2
def _fsdp_clip(rank: int, world_size: int, mode: str, norm_type: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _Model()
    model.heads.append(nn.Linear(3, 7))  # 21 + 7 values: uneven shards over 2 ranks
    if world_size > 1:
        from torch.distributed.fsdp import fully_shard

        for module in (model.trunk, *model.heads):
            fully_shard(module)
        fully_shard(model)
    g = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        full = torch.randn(p.shape, generator=g) * (5.0 if "trunk" in name else 0.2)
        if hasattr(p, "placements"):  # a DTensor parameter: its gradient is sharded alike
            from torch.distributed.tensor import distribute_tensor

            p.grad = distribute_tensor(full, p.device_mesh, p.placements)
        else:
            p.grad = full
    hook = GradClipHook(max_norm=1.0, mode=mode, norm_type=norm_type)
    hook.on_backward(_task(model))  # type: ignore[arg-type]
    out = {}
    for name, p in model.named_parameters():
        grad = p.grad
        out[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()
    return out


@pytest.mark.slow  # 2 gloo processes and FSDP2's sharding: ~15 s on 2 busy cores
@pytest.mark.parametrize(
    ("mode", "norm_type"), [("per_parameter", 2), ("per_module", 2), ("per_parameter", "inf")]
)
def test_fsdp_sharded_gradients_are_clipped_by_their_whole_norm(mode: str, norm_type: Any) -> None:
    ranks = spawn_gloo(_fsdp_clip, 2, mode, norm_type)
    reference = _fsdp_clip(0, 1, mode, norm_type)
    # the one-process result is the rule's
    assert torch.linalg.vector_norm(
        torch.cat([reference["trunk.weight"].flatten(), reference["trunk.bias"].flatten()])
        if mode == "per_module"
        else reference["trunk.weight"],
        ord=math.inf if norm_type == "inf" else 2,
    ).item() == pytest.approx(1.0, rel=1e-5)
    for out in ranks:
        for name, value in reference.items():
            torch.testing.assert_close(out[name], value, rtol=1e-6, atol=1e-7)
