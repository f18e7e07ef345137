"""extra_scripts/convert_vissl_to_torchvision.py: vissl ResNet trunk <-> torchvision ResNet.

The must-show check: a quick_start-like checkpoint (quick_start at WIDTH_MULTIPLIER 1,
trained for 2 iterations so BatchNorm statistics are not their defaults) converted by the
command line loads strictly into torchvision's ResNet-18 built as the script prints, and
gives vissl's trunk features to 1e-5 in eval mode; converted back with ``--reverse`` it
initialises a fresh vissl model through MODEL.WEIGHTS_INIT to the same features.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

from tests.extra_scripts._helpers import (
    assert_one_line_error,
    import_script,
    run_as_main,
    run_script,
    script_error,
)
from tests.integration._runs import run_config
from vissl.config.attr_dict import AttrDict
from vissl.models import build_model
from vissl.trainer.checkpointing import split_model_state
from vissl.utils.hydra_config import config_to_yaml, hydra_compose_and_validate
from vissl.utils.weights_init import init_model_from_weights_params_file

conv = import_script("convert_vissl_to_torchvision")
SCRIPT = "convert_vissl_to_torchvision"
TOL = 1e-5

#: Overrides of config=quick_start: full width (torchvision's ResNet-18 has width 64), 2 steps.
QUICK_START_LIKE = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=1",
    "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[512,512],use_relu:true,"
    "skip_last_layer_relu_bn:false}],[mlp,{dims:[512,64]}]]",
    "config.OPTIMIZER.num_epochs=1",
    "config.DATA.TRAIN.DATA_LIMIT=32",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
    "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false",
]


@functools.cache
def compose(*overrides: str) -> AttrDict:
    """The validated config section (cached: the tests only read it)."""
    return hydra_compose_and_validate(list(overrides))[1]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> None:
    """Non-default BatchNorm affine weights and running statistics, so they matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
                n = m.num_features
                m.weight.copy_(0.5 + torch.rand(n, generator=gen))
                m.bias.copy_(0.2 * torch.randn(n, generator=gen))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(n, generator=gen))


def save_vissl_checkpoint(model: nn.Module, cfg: AttrDict | None, path: Path) -> Path:
    """``model`` in the layout a vissl run writes (model part, plus the config text)."""
    state: dict[str, Any] = {
        "classy_state_dict": {
            "base_model": {"model": split_model_state(model.state_dict()), "meta": {}}
        }
    }
    if cfg is not None:
        state["config"] = config_to_yaml(cfg)
    torch.save(state, path)
    return path


def torchvision_small_stem_resnet18() -> nn.Module:
    """torchvision's ResNet-18 built as the script tells for quick_start's stem."""
    model = torchvision.models.resnet18()
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    model.fc = nn.Identity()
    return model


@pytest.fixture
def quick_start_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("quick_start_like")
    run_config("quick_start", *QUICK_START_LIKE, f"config.CHECKPOINT.DIR={folder}")
    path = folder / "model_final_checkpoint_phase0.torch"
    assert path.is_file(), sorted(os.listdir(folder))
    return path


@pytest.mark.slow
def test_quick_start_like_checkpoint_gives_the_same_features_in_torchvision_and_back(
    quick_start_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = compose("config=quick_start", *QUICK_START_LIKE)
    vissl_model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    init_model_from_weights_params_file(
        vissl_model, {"PARAMS_FILE": str(quick_start_checkpoint)}, cfg.MODEL
    )
    vissl_model.eval()
    bn = vissl_model.trunk._feature_blocks.bn1
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))  # trained

    out = tmp_path / "resnet18_trunk.pth"
    proc = run_script(SCRIPT, str(quick_start_checkpoint), str(out))
    assert proc.returncode == 0, proc.stderr
    assert "torchvision.models.resnet18()" in proc.stdout
    assert "model.maxpool = nn.Identity()" in proc.stdout
    assert "nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)" in proc.stdout

    state = torch.load(out, weights_only=True)
    # the standard stem does not take these weights: the printed stem lines are needed
    plain = torchvision.models.resnet18()
    plain.fc = nn.Identity()
    with pytest.raises(RuntimeError, match="conv1.weight"):
        plain.load_state_dict(state)
    tv_model = torchvision_small_stem_resnet18()
    tv_model.load_state_dict(state, strict=True)
    tv_model.eval()

    torch.manual_seed(0)
    diffs = []
    for size in (8, 16):  # the trained size and another
        x = torch.randn(6, 3, size, size)
        with torch.no_grad():
            expected = vissl_model.trunk(x)[0]
            got = tv_model(x)
        assert expected.shape == (6, 512)
        diffs.append(max_diff(expected, got))
    assert max(diffs) <= TOL

    # torchvision -> vissl: a fresh model initialised through MODEL.WEIGHTS_INIT
    tv_file = tmp_path / "from_torchvision.pth"
    torch.save(tv_model.state_dict(), tv_file)
    back = tmp_path / "vissl_init.torch"
    assert conv.main(["--reverse", str(tv_file), str(back)]) == 0
    assert "config.MODEL.TRUNK.RESNETS.SMALL_IMAGE_STEM=True" in capsys.readouterr().out
    torch.manual_seed(123)
    fresh = build_model(cfg.MODEL, cfg.OPTIMIZER)
    report = init_model_from_weights_params_file(fresh, {"PARAMS_FILE": str(back)}, cfg.MODEL)
    assert len([k for k in report.loaded if k.startswith("trunk.")]) == len(state)
    fresh.eval()
    x = torch.randn(6, 3, 8, 8)
    with torch.no_grad():
        back_diff = max_diff(fresh.trunk(x)[0], tv_model(x))
    print(
        f"max abs feature diff: vissl -> torchvision {diffs} (8, 16 px), "
        f"torchvision -> vissl WEIGHTS_INIT {back_diff}"
    )
    assert back_diff <= TOL


def test_torchvision_resnext_initialises_vissl_resnext(tmp_path: Path) -> None:
    """Bottleneck blocks and groups: resnext50_32x4d is vissl's DEPTH 50, GROUPS 32,
    WIDTH_PER_GROUP 4 (with GROUPS 1 and WIDTH_PER_GROUP 64, torchvision's resnet50)."""
    resnets = {"DEPTH": 50, "GROUPS": 32, "WIDTH_PER_GROUP": 4}
    torch.manual_seed(0)
    tv_model = torchvision.models.resnext50_32x4d()
    randomize_batchnorm(tv_model)
    tv_model.eval()
    checkpoint, arch = conv.torchvision_to_vissl(tv_model.state_dict())
    assert arch.builder == "resnext50_32x4d" and not arch.small_image_stem
    assert "config.MODEL.TRUNK.RESNETS.GROUPS=32" in arch.vissl_overrides()

    cfg = compose(
        "config=test/cpu_test/tiny_supervised",
        *[f"config.MODEL.TRUNK.RESNETS.{k}={v}" for k, v in resnets.items()],
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[2048,10]}]]",
    )
    path = tmp_path / "init.torch"
    torch.save(checkpoint, path)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)}, cfg.MODEL)
    model.eval()
    tv_model.fc = nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(model.trunk(x)[0], tv_model(x)) <= TOL


def test_head_as_fc_and_fc_as_head_keep_the_logits(tmp_path: Path) -> None:
    cfg = compose("config=test/cpu_test/tiny_supervised")  # ResNet-18, head mlp [512, 10]
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    randomize_batchnorm(model)
    model.eval()
    ckpt = save_vissl_checkpoint(model, cfg, tmp_path / "supervised.torch")

    state, arch, num_classes = conv.vissl_to_torchvision(
        torch.load(ckpt, weights_only=True), head_as_fc=True
    )
    assert num_classes == 10 and arch.builder == "resnet18"
    tv_model = torchvision.models.resnet18(num_classes=10)
    tv_model.load_state_dict(state, strict=True)
    tv_model.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(model(x)[0], tv_model(x)) <= TOL

    back, _ = conv.torchvision_to_vissl(tv_model.state_dict(), fc_as_head=True)
    path = tmp_path / "back.torch"
    torch.save(back, path)
    fresh = build_model(cfg.MODEL, cfg.OPTIMIZER)
    report = init_model_from_weights_params_file(fresh, {"PARAMS_FILE": str(path)}, cfg.MODEL)
    assert "heads.0.clf.0.weight" in report.loaded
    fresh.eval()
    with torch.no_grad():
        assert max_diff(fresh(x)[0], tv_model(x)) <= TOL

    # without --head-as-fc the file is the trunk only; a two-layer head is refused
    state, _, num_classes = conv.vissl_to_torchvision(torch.load(ckpt, weights_only=True))
    assert num_classes is None and "fc.weight" not in state
    two_layers = torch.load(ckpt, weights_only=True)
    heads = two_layers["classy_state_dict"]["base_model"]["model"]["heads"]
    heads["0.clf.2.weight"] = torch.zeros(10, 10)  # e.g. mlp with dims [512, 10, 10]
    with pytest.raises(conv.ScriptError, match="one linear layer"):
        conv.vissl_to_torchvision(two_layers, head_as_fc=True)


def test_bgr_input_is_folded_into_conv1(tmp_path: Path) -> None:
    cfg = compose("config=test/cpu_test/tiny_supervised", "config.MODEL.INPUT_TYPE=bgr")
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    randomize_batchnorm(model)
    model.eval()
    ckpt = save_vissl_checkpoint(model, cfg, tmp_path / "bgr.torch")
    state, arch, _ = conv.vissl_to_torchvision(torch.load(ckpt, weights_only=True))
    tv_model = conv.build_torchvision_resnet(arch)
    tv_model.load_state_dict(state)
    tv_model.eval()
    x = torch.randn(2, 3, 32, 32)  # the RGB batch both models receive
    with torch.no_grad():
        assert max_diff(model.trunk(x)[0], tv_model(x)) <= TOL


def _error(*args: str) -> str:
    return script_error(conv.main, *args)


def test_wrong_inputs_give_clear_errors(tmp_path: Path) -> None:
    out = str(tmp_path / "out.pth")
    assert "does not exist" in _error(str(tmp_path / "missing.torch"), out)
    not_a_checkpoint = tmp_path / "notes.torch"
    not_a_checkpoint.write_text("not a checkpoint\n")
    code, _, err = run_as_main(SCRIPT, str(not_a_checkpoint), out)  # the __main__ block
    assert_one_line_error(code, err, "notes.torch", "not a checkpoint")

    # a torchvision state dict without --reverse, and a vissl checkpoint with it
    tv_file = tmp_path / "tv.pth"
    torch.save(torchvision.models.resnet18().state_dict(), tv_file)
    assert "add --reverse" in _error(str(tv_file), out)
    cfg = compose("config=test/cpu_test/tiny_supervised")
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    ckpt = save_vissl_checkpoint(model, cfg, tmp_path / "vissl.torch")
    assert "leave out --reverse" in _error("--reverse", str(ckpt), out)

    # a dict that is no checkpoint at all
    other = tmp_path / "other.torch"
    torch.save({"weights": torch.zeros(3)}, other)
    assert "not a vissl checkpoint" in _error(str(other), out)

    # a vissl checkpoint without trunk weights
    no_trunk = tmp_path / "no_trunk.torch"
    state = torch.load(ckpt, weights_only=True)
    state["classy_state_dict"]["base_model"]["model"]["trunk"] = {}
    torch.save(state, no_trunk)
    assert "no trunk weights" in _error(str(no_trunk), out)

    # quick_start itself: half width does not fit torchvision's ResNet
    qs = compose("config=quick_start")
    half = save_vissl_checkpoint(build_model(qs.MODEL, qs.OPTIMIZER), qs, tmp_path / "qs.torch")
    assert "WIDTH_MULTIPLIER=1" in _error(str(half), out)

    # trunk options torchvision's ResNet cannot express
    stride = compose(
        "config=test/cpu_test/tiny_supervised", "config.MODEL.TRUNK.RESNETS.LAYER4_STRIDE=1"
    )
    l4 = save_vissl_checkpoint(
        build_model(stride.MODEL, stride.OPTIMIZER), stride, tmp_path / "l4.torch"
    )
    assert "LAYER4_STRIDE" in _error(str(l4), out)
    gn = compose(
        "config=test/cpu_test/tiny_supervised", "config.MODEL.TRUNK.RESNETS.NORM=GroupNorm"
    )
    gn_ckpt = save_vissl_checkpoint(build_model(gn.MODEL, gn.OPTIMIZER), gn, tmp_path / "gn.torch")
    assert "BatchNorm" in _error(str(gn_ckpt), out)

    # an unsupported trunk, with its config (ours) and without (VISSL's checkpoints)
    vit = compose("config=test/integration_test/quick_dino_vit")
    vit_model = build_model(vit.MODEL, vit.OPTIMIZER)
    with_config = save_vissl_checkpoint(vit_model, vit, tmp_path / "vit.torch")
    assert "'vision_transformer' trunk" in _error(str(with_config), out)
    bare = save_vissl_checkpoint(vit_model, None, tmp_path / "vit_bare.torch")
    assert "not vissl's ResNet" in _error(str(bare), out)
    assert not os.path.exists(out)

    # a file that is no ResNet state dict, with --reverse
    assert "not ResNet weights" in _error("--reverse", str(other), out)
    # option mistakes
    assert "--fc-as-head" in _error("--reverse", "--head-as-fc", str(tv_file), out)
    assert "go together" in _error("--model_url_or_file", str(ckpt))


def test_vissl_flags_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose("config=test/cpu_test/tiny_supervised")
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    ckpt = save_vissl_checkpoint(model, cfg, tmp_path / "vissl.torch")
    args = [
        "--model_url_or_file",
        str(ckpt),
        "--output_dir",
        str(tmp_path / "d"),
        "--output_name",
        "rn18",
    ]
    assert conv.main(args) == 0
    state = torch.load(tmp_path / "d" / "rn18.torch", weights_only=True)
    torchvision_model = torchvision.models.resnet18()
    torchvision_model.fc = nn.Identity()
    torchvision_model.load_state_dict(state)

    with pytest.raises(SystemExit) as exit_info:
        conv.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for fragment in ("--reverse", "SMALL_IMAGE_STEM", "examples:", "WEIGHTS_INIT", "--head-as-fc"):
        assert fragment in text
