"""extra_scripts/convert_dino_checkpoint.py: DINO's checkpoints -> files WEIGHTS_INIT loads.

facebookresearch/dino's side is written here from its layout (never downloaded): the full
checkpoint holds ``teacher`` (``backbone.*``, ``head.*``) and ``student`` (the same under
``module.``) state dicts, ``args`` (an ``argparse.Namespace``), ``optimizer``, ``epoch`` and
``dino_loss``; the ViT backbone is tests/_reference_models.py's DinoViT and the head is
DINO's DINOHead (``mlp`` Linear-GELU-Linear-GELU-Linear, then the weight-normalised
``last_layer`` with ``weight_g`` / ``weight_v``), computed by hand below.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from omegaconf import OmegaConf

import vissl
from tests._reference_models import DinoViT, randomize
from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main
from vissl.config.attr_dict import AttrDict
from vissl.losses.dino_loss import DINOLoss
from vissl.models import build_model
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.weights_init import init_model_from_weights_params_file

dino = import_script("convert_dino_checkpoint")
torch.set_num_threads(1)
_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]
VIT = {
    "IMAGE_SIZE": 32,
    "PATCH_SIZE": 8,
    "HIDDEN_DIM": 32,
    "NUM_LAYERS": 2,
    "NUM_HEADS": 4,
    "MLP_DIM": 64,
    "QKV_BIAS": True,
}
HEAD = {
    "in_dim": 32,
    "num_clusters": [16],
    "use_bn": False,
    "normalize_last_layer": False,
    "num_layers": 3,
    "hidden_dim": 24,
    "bottleneck_dim": 8,
}


def dino_head_state(seed: int) -> dict[str, torch.Tensor]:
    """DINO's DINOHead(32, 16, hidden_dim=24, bottleneck_dim=8, norm_last_layer=False)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"mlp.0": (24, 32), "mlp.2": (24, 24), "mlp.4": (8, 24)}
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        state[f"{name}.weight"] = torch.randn(shape, generator=gen) * 0.2
        state[f"{name}.bias"] = torch.randn(shape[0], generator=gen) * 0.2
    state["last_layer.weight_g"] = torch.rand(16, 1, generator=gen) + 0.5
    state["last_layer.weight_v"] = torch.randn(16, 8, generator=gen)
    return state


def dino_head_forward(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for i in (0, 2, 4):
        x = F.linear(x, state[f"mlp.{i}.weight"], state[f"mlp.{i}.bias"])
        x = F.gelu(x) if i < 4 else x
    x = F.normalize(x, dim=-1)
    v = state["last_layer.weight_v"]
    return F.linear(x, state["last_layer.weight_g"] * v / v.norm(dim=1, keepdim=True))


def build(trunk: dict[str, Any], heads: list[Any] | None = None) -> Any:
    cfg = AttrDict(copy.deepcopy(_MODEL))
    cfg.TRUNK.update(trunk)
    cfg.HEAD.PARAMS = heads or []
    return build_model(cfg, AttrDict())


def load(model: Any, path: Path) -> Any:
    init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)}, model.model_config)
    return model.eval()


def test_full_dino_checkpoint_teacher_to_vit_and_dino_head(tmp_path: Path) -> None:
    teacher, student = (
        randomize(DinoViT(32, 8, 32, 2, 4, 64), 1),
        randomize(DinoViT(32, 8, 32, 2, 4, 64), 2),
    )
    teacher_head, student_head = dino_head_state(3), dino_head_state(4)
    full = {
        "teacher": {
            **{f"backbone.{k}": v for k, v in teacher.state_dict().items()},
            **{f"head.{k}": v for k, v in teacher_head.items()},
        },
        "student": {
            **{f"module.backbone.{k}": v for k, v in student.state_dict().items()},
            **{f"module.head.{k}": v for k, v in student_head.items()},
        },
        "optimizer": {"state": {}, "param_groups": []},
        "epoch": 100,
        "args": argparse.Namespace(
            arch="vit_custom", patch_size=8, out_dim=16, norm_last_layer=False
        ),
        "dino_loss": {"center": torch.zeros(1, 16)},
    }
    torch.save(full, tmp_path / "dino_full_checkpoint.pth")
    out = tmp_path / "teacher.torch"
    code, stdout, err = run_as_main(
        "convert_dino_checkpoint",
        str(tmp_path / "dino_full_checkpoint.pth"),
        str(out),
        "--num-heads",
        "4",
    )
    assert code == 0, err
    for key, value in VIT.items():
        assert f"config.MODEL.TRUNK.VISION_TRANSFORMERS.{key}={value}" in stdout
    assert (
        "[[dino_head,{in_dim:32,num_clusters:[16],use_bn:false,normalize_last_layer:false,"
        in stdout
    )
    model = load(
        build({"NAME": "vision_transformer", "VISION_TRANSFORMERS": VIT}, [["dino_head", HEAD]]),
        out,
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = teacher(x)
        torch.testing.assert_close(model.trunk(x)[0], features, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            model.heads[0](features),
            dino_head_forward(teacher_head, features),
            rtol=1e-4,
            atol=1e-5,
        )
    # the student, and the trunk alone
    assert (
        dino.main(
            [
                str(tmp_path / "dino_full_checkpoint.pth"),
                str(out),
                "--model",
                "student",
                "--num-heads",
                "4",
                "--trunk-only",
            ]
        )
        == 0
    )
    assert load_checkpoint(str(out))["classy_state_dict"]["base_model"]["model"]["heads"] == {}
    model = load(build({"NAME": "vision_transformer", "VISION_TRANSFORMERS": VIT}), out)
    with torch.no_grad():
        torch.testing.assert_close(model.trunk(x)[0], student(x), rtol=1e-5, atol=1e-5)


def test_backbone_only_files_vit_and_resnet(tmp_path: Path) -> None:
    vit = randomize(DinoViT(32, 8, 64, 2, 1, 64), 5)  # width 64: NUM_HEADS 64/64 = 1 by default
    torch.save(vit.state_dict(), tmp_path / "dino_vit_pretrain.pth")
    assert dino.main([str(tmp_path / "dino_vit_pretrain.pth"), str(tmp_path / "vit.torch")]) == 0
    settings = {**VIT, "HIDDEN_DIM": 64, "NUM_HEADS": 1}
    model = load(
        build({"NAME": "vision_transformer", "VISION_TRANSFORMERS": settings}),
        tmp_path / "vit.torch",
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.trunk(x)[0], vit(x), rtol=1e-5, atol=1e-5)
    resnet = randomize(torchvision.models.resnet18(), 6)
    torch.save(resnet.state_dict(), tmp_path / "dino_resnet_pretrain.pth")
    code, stdout, _ = run_as_main(
        "convert_dino_checkpoint",
        str(tmp_path / "dino_resnet_pretrain.pth"),
        str(tmp_path / "rn.torch"),
    )
    assert code == 0 and "config.MODEL.TRUNK.RESNETS.DEPTH=18" in stdout
    model = load(
        build({"NAME": "resnet", "RESNETS": {"DEPTH": 18, "WIDTH_MULTIPLIER": 1}}),
        tmp_path / "rn.torch",
    )
    resnet.fc = torch.nn.Identity()
    with torch.no_grad():
        torch.testing.assert_close(model.trunk(x)[0], resnet(x), rtol=1e-5, atol=1e-5)


def test_teacher_of_a_vissl_and_a_VISSL_dino_checkpoint(tmp_path: Path) -> None:
    """VISSL's convert_dino_checkpoint.py: the teacher kept in the loss state (ours:
    teacher.*, VISSL's: momentum_teacher.[module.]*) becomes the model of a new file."""
    student = build(
        {"NAME": "vision_transformer", "VISION_TRANSFORMERS": VIT}, [["dino_head", HEAD]]
    )
    loss = DINOLoss(output_dim=16, normalize_last_layer=False)
    loss.bind_model(student)
    randomize(loss.teacher, 7)  # type: ignore[arg-type]
    ours = {
        "classy_state_dict": {
            "base_model": {"model": {"trunk": {}, "heads": {}}},
            "loss": loss.state_dict(),
        }
    }
    teacher = {k: v for k, v in loss.state_dict().items() if k.startswith("teacher.")}
    theirs = {
        "classy_state_dict": {
            "loss": {
                "momentum_teacher.module." + k[len("teacher.") :]: v for k, v in teacher.items()
            }
        }
    }
    x = torch.randn(2, 3, 32, 32)
    for name, checkpoint in (("ours", ours), ("vissl", theirs)):
        torch.save(checkpoint, tmp_path / f"{name}.torch")
        code, _, err = run_as_main(
            "convert_dino_checkpoint",
            "-i",
            str(tmp_path / f"{name}.torch"),
            "-o",
            str(tmp_path / "t.torch"),
        )
        assert code == 0, err
        model = load(
            build(
                {"NAME": "vision_transformer", "VISION_TRANSFORMERS": VIT}, [["dino_head", HEAD]]
            ),
            tmp_path / "t.torch",
        )
        with torch.no_grad():
            torch.testing.assert_close(model(x)[0], loss.teacher(x)[0], rtol=1e-5, atol=1e-5)  # type: ignore[misc]
    torch.save(
        {"classy_state_dict": {"loss": {"center": torch.zeros(3)}}}, tmp_path / "no_teacher.torch"
    )
    code, _, err = run_as_main(
        "convert_dino_checkpoint", str(tmp_path / "no_teacher.torch"), "o.torch"
    )
    assert_one_line_error(code, err, "holds no DINO teacher")
    torch.save({"teacher": {"backbone.conv.weight": torch.zeros(1)}}, tmp_path / "odd.pth")
    code, _, err = run_as_main("convert_dino_checkpoint", str(tmp_path / "odd.pth"), "o.torch")
    assert_one_line_error(code, err, "neither a DINO ViT")
