"""The digits kNN probes of DINO, iBOT, DINOv2 and MSN read the encoder their authors
evaluate: the EMA teacher (DINO's and iBOT's ``eval_knn.py --checkpoint_key teacher``,
DINOv2's ``load_pretrained_weights(..., "teacher")``) or the target encoder (MSN's
``checkpoint['target_encoder']``). Our checkpoints keep it in the loss state
(``classy_state_dict.loss``, keys ``teacher.trunk.*``); ``nn_digits_ibot`` and
``nn_digits_msn`` read it by default, the group file ``digits/encoder=student`` reads the
student (the model's own trunk) and ``digits/encoder=teacher`` the teacher on
quick_start's ResNet probe (``digits/dino``).

A checkpoint in the trainer's layout whose teacher differs from its student (the teacher
moved away from the student on purpose) goes through the probe's own model build and
``WEIGHTS_INIT``: the probe's trunk holds the teacher's weights bitwise, or the student's
with the student group file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vissl.losses import build_loss
from vissl.models import build_model
from vissl.utils.checkpoint import split_model_state
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.weights_init import init_model_from_weights_params_file

PROBES = "benchmark/nearest_neighbor/digits/"
TEACHER = f"+config/{PROBES}encoder=teacher"
STUDENT = f"+config/{PROBES}encoder=student"
TEACHER_KEYS = (["classy_state_dict", "loss"], "teacher.")
STUDENT_KEYS = ("classy_state_dict", "")

# (pretraining recipe, its probe, the group file that makes the probe read the teacher)
RECIPES = [
    ("digits/dino_vit", "nn_digits_ibot", None),
    ("digits/ibot", "nn_digits_ibot", None),
    ("digits/dinov2", "nn_digits_ibot", None),
    ("digits/msn", "nn_digits_msn", None),
    ("digits/dino", "nn_digits_quick_start", TEACHER),
]


def _weights_keys(*overrides: str) -> tuple[object, str]:
    _, cfg = hydra_compose_and_validate(list(overrides))
    w = cfg.MODEL.WEIGHTS_INIT
    key = w.STATE_DICT_KEY_NAME
    return (list(key) if not isinstance(key, str) else key), str(w.REMOVE_PREFIX)


@pytest.mark.parametrize("probe", ["nn_digits_ibot", "nn_digits_msn"])
def test_vit_probes_read_the_teacher_by_default_and_the_student_on_request(probe: str) -> None:
    assert _weights_keys(f"config={PROBES}{probe}") == TEACHER_KEYS
    assert _weights_keys(f"config={PROBES}{probe}", STUDENT) == STUDENT_KEYS


def test_resnet_probe_reads_the_teacher_with_the_teacher_group_file() -> None:
    """quick_start's probe serves every ResNet method (most have no teacher): it keeps
    the trunk; digits/dino adds the teacher group file."""
    assert _weights_keys(f"config={PROBES}nn_digits_quick_start") == STUDENT_KEYS
    assert _weights_keys(f"config={PROBES}nn_digits_quick_start", TEACHER) == TEACHER_KEYS


def _trunk(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``prefix + 'trunk.' + name`` (or ``trunk.base_model.``) -> name."""
    out = {}
    for key, value in state.items():
        if not key.startswith(prefix + "trunk."):
            continue
        name = key[len(prefix + "trunk.") :]
        out[name.removeprefix("base_model.")] = value
    return out


def _checkpoint_with_a_distinct_teacher(tmp_path: Path, recipe: str) -> tuple[Path, dict, dict]:
    """The recipe's model and loss at init, the teacher moved off the student; saved as
    the trainer saves (classy_state_dict.base_model.model and classy_state_dict.loss)."""
    _, cfg = hydra_compose_and_validate([f"config={recipe}"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    loss.bind_model(model)
    with torch.no_grad():
        for p in loss.teacher.parameters():
            p.add_(torch.randn_like(p))
    student = {k: v.clone() for k, v in model.state_dict().items()}
    teacher = {k: v.clone() for k, v in loss.state_dict().items()}
    path = tmp_path / "model_final_checkpoint_phase0.torch"
    torch.save(
        {
            "phase_idx": 0,
            "classy_state_dict": {
                "base_model": {"model": split_model_state(model.state_dict()), "meta": {}},
                "loss": loss.state_dict(),
            },
        },
        path,
    )
    return path, _trunk(student, ""), _trunk(teacher, "teacher.")


def _probe_trunk(probe: str, params_file: Path, *group_files: str) -> dict[str, torch.Tensor]:
    """The trunk of ``probe``'s model after its WEIGHTS_INIT (what extract_features does)."""
    _, cfg = hydra_compose_and_validate(
        [
            f"config={PROBES}{probe}",
            *group_files,
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={params_file}",
        ]
    )
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
    return _trunk(model.state_dict(), "")


def _assert_equal(probe: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    assert probe and set(probe) <= set(source), sorted(set(probe) - set(source))[:5]
    for name, value in probe.items():
        assert torch.equal(value, source[name]), name


@pytest.mark.parametrize(("recipe", "probe", "teacher_file"), RECIPES)
def test_probe_loads_the_teacher_bitwise_and_the_student_variant_the_student(
    tmp_path: Path, recipe: str, probe: str, teacher_file: str | None
) -> None:
    path, student, teacher = _checkpoint_with_a_distinct_teacher(tmp_path, recipe)
    weights = [n for n, v in teacher.items() if v.is_floating_point() and v.ndim > 1]
    assert weights and all(not torch.equal(teacher[n], student[n]) for n in weights)
    _assert_equal(_probe_trunk(probe, path, *([teacher_file] if teacher_file else [])), teacher)
    _assert_equal(_probe_trunk(probe, path, STUDENT), student)
