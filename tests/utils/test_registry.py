"""The generic Registry: lookups, errors, duplicates, fallbacks."""

from __future__ import annotations

import pytest

from vissl.errors import DuplicateNameError, UnknownNameError
from vissl.utils.registry import Registry


def test_register_decorator_and_get():
    reg: Registry[object] = Registry("widget", config_key="config.WIDGET.NAME")

    @reg.register("round")
    class Round:
        pass

    assert reg.get("round") is Round
    assert "round" in reg and len(reg) == 1 and list(reg) == ["round"]


def test_register_direct_call_and_default_name():
    reg: Registry[object] = Registry("widget")

    def square():
        return 4

    reg.register(None, square)
    assert reg.get("square") is square


def test_unknown_name_error_lists_names_and_closest_match():
    reg: Registry[object] = Registry("train step", config_key="config.TRAINER.TRAIN_STEP_NAME")
    reg.register("standard_train_step", object())
    reg.register("other_step", object())
    with pytest.raises(UnknownNameError) as info:
        reg.get("standard_trian_step")
    msg = str(info.value)
    assert "'standard_trian_step'" in msg
    assert "train step" in msg
    assert "Did you mean 'standard_train_step'?" in msg
    assert "['other_step', 'standard_train_step']" in msg
    assert "config.TRAINER.TRAIN_STEP_NAME" in msg
    assert isinstance(info.value, KeyError)


def test_duplicate_names_the_first_module():
    reg: Registry[object] = Registry("loss")

    def first():
        pass

    reg.register("x", first)

    def second():
        pass

    with pytest.raises(DuplicateNameError) as info:
        reg.register("x", second)
    assert __name__ in str(info.value) and "first" in str(info.value)
    reg.register("x", second, force=True)
    assert reg.get("x") is second


def test_reregistering_same_definition_is_not_a_conflict():
    reg: Registry[object] = Registry("loss")

    def fn():
        pass

    reg.register("x", fn)
    reg.register("x", fn)
    assert reg.get("x") is fn


def test_fallback_resolver():
    reg: Registry[object] = Registry("transform")
    reg.add_fallback(lambda name: name.upper() if name.startswith("tv_") else None)
    assert reg.get("tv_crop") == "TV_CROP"
    with pytest.raises(UnknownNameError):
        reg.get("nope")


def test_base_class_enforced():
    class Base:
        pass

    reg: Registry[type] = Registry("engine", base=Base)
    with pytest.raises(TypeError, match="subclass"):
        reg.register("bad", int)


def test_every_plugin_kind_uses_the_registry():
    from vissl.data.collators import COLLATOR_REGISTRY
    from vissl.data.data_sources import DATA_SOURCE_REGISTRY
    from vissl.data.ssl_transforms import TRANSFORM_REGISTRY
    from vissl.engines import ENGINE_REGISTRY
    from vissl.hooks import HOOK_REGISTRY
    from vissl.losses import LOSS_REGISTRY
    from vissl.meters import METER_REGISTRY
    from vissl.models import MODEL_REGISTRY
    from vissl.models.heads import MODEL_HEADS_REGISTRY
    from vissl.models.trunks import MODEL_TRUNKS_REGISTRY
    from vissl.optimizers import OPTIMIZER_REGISTRY
    from vissl.optimizers.param_scheduler import PARAM_SCHEDULER_REGISTRY
    from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY

    registries = [
        COLLATOR_REGISTRY,
        DATA_SOURCE_REGISTRY,
        TRANSFORM_REGISTRY,
        ENGINE_REGISTRY,
        HOOK_REGISTRY,
        LOSS_REGISTRY,
        METER_REGISTRY,
        MODEL_REGISTRY,
        MODEL_HEADS_REGISTRY,
        MODEL_TRUNKS_REGISTRY,
        OPTIMIZER_REGISTRY,
        PARAM_SCHEDULER_REGISTRY,
        TRAIN_STEP_REGISTRY,
    ]
    assert all(isinstance(r, Registry) for r in registries)
    assert "standard_train_step" in TRAIN_STEP_REGISTRY
    assert {"resnet", "regnet"} <= set(MODEL_TRUNKS_REGISTRY)
    assert {"mlp", "identity"} <= set(MODEL_HEADS_REGISTRY)
    assert {"simclr_info_nce_loss", "cross_entropy_multiple_output_single_target"} <= set(
        LOSS_REGISTRY
    )
    assert {"synthetic", "disk_folder", "disk_filelist", "digits"} <= set(DATA_SOURCE_REGISTRY)
    assert {"default_collate", "simclr_collator", "multicrop_collator"} <= set(COLLATOR_REGISTRY)
    assert {"sgd", "adam", "adamw"} <= set(OPTIMIZER_REGISTRY)
    assert {"composite", "cosine", "linear", "multistep", "constant"} <= set(
        PARAM_SCHEDULER_REGISTRY
    )
    assert "accuracy_list_meter" in METER_REGISTRY
    assert "train" in ENGINE_REGISTRY


@pytest.mark.parametrize(
    "misspelt,meant",
    [
        ("RandomResizeCrop", "RandomResizedCrop"),  # #41 item 10: it suggested RandomErasing
        ("RandomHorizontalFlp", "RandomHorizontalFlip"),
        ("ImgPilToMultiCrops", "ImgPilToMultiCrop"),
    ],
)
def test_a_misspelt_transform_is_suggested_the_torchvision_name_too(misspelt, meant):
    from vissl.data.ssl_transforms import TRANSFORM_REGISTRY

    with pytest.raises(UnknownNameError) as info:
        TRANSFORM_REGISTRY.get(misspelt)
    assert f"Did you mean {meant!r}?" in str(info.value)
    assert "every class of torchvision.transforms" in str(info.value)


def test_a_misspelt_torch_loss_is_suggested_its_name():
    from vissl.losses import LOSS_REGISTRY

    with pytest.raises(UnknownNameError, match="Did you mean 'CrossEntropyLoss'"):
        LOSS_REGISTRY.get("CrossEntropyLos")


def test_fallback_names_feed_the_suggestion():
    reg: Registry[object] = Registry("thing")
    reg.register("alpha", object())
    reg.add_fallback(lambda n: None, lambda: ["BetaGamma"], "every beta")
    with pytest.raises(UnknownNameError) as info:
        reg.get("BetaGama")
    assert "Did you mean 'BetaGamma'?" in str(info.value) and ", and every beta." in str(info.value)
