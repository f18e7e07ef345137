"""The method index: one entry per self-supervised method naming every piece it is made of.

A method in vissl is not a class: it is a loss, the heads it trains, the collator and
transforms that make its views, the hooks its loss asks for, a frozen (momentum) copy
where it has one, its configs (a quick CPU config for the tests, a digits config, the
ImageNet recipes) and a docs page. :data:`METHODS` names them all, by registry name and
config name, so a method's pieces are found from one entry::

    from vissl.methods import get_method
    spec = get_method("dino")
    spec.loss, spec.heads, spec.hooks, spec.configs.digits, spec.docs

``tests/test_methods.py`` checks that every name resolves in its registry, every config
file exists and composes, every hook class imports, each registered self-supervised loss
belongs to exactly one method, and (slow) that the loss built from the quick config asks
for exactly the hooks listed here. ``extra_scripts/generate_methods_table.py`` writes the
methods table of ``docs/methods/index.md`` from this index.

Adding a method: its loss (registered), its configs, its docs page and one
:class:`MethodSpec` below.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass

from vissl.errors import UnknownNameError

__all__ = ["METHODS", "MethodConfigs", "MethodSpec", "get_method", "method_names"]

#: Losses shared by supervised and pretext tasks (not owned by one method).
SHARED_LOSSES = frozenset(
    {"cross_entropy_multiple_output_single_target", "bce_logits_multiple_output_single_target"}
)


@dataclass(frozen=True)
class MethodConfigs:
    """Config names (``config=<name>``, relative to ``configs/config``) of one method."""

    quick: tuple[str, ...] = ()  # seconds on a CPU: the integration tests and golden traces
    digits: tuple[str, ...] = ()  # minutes on a CPU, with a kNN figure in docs/evaluation.md
    pretrain: tuple[str, ...] = ()  # the authors' ImageNet recipes (8 and 64 GPUs)

    def all(self) -> tuple[str, ...]:
        return (*self.quick, *self.digits, *self.pretrain)


@dataclass(frozen=True)
class MethodSpec:
    """Every piece of one method, by the names the config uses.

    Attributes:
        name: the index key (``get_method(name)``).
        title: the method as its paper names it.
        paper: first author, year.
        loss: the registered loss names (``config.LOSS.name``); a variant of the method
            (SwAV with a momentum encoder, NNCLR under VISSL's name) is a second name.
        trunks: the trunks its configs use (``config.MODEL.TRUNK.NAME``).
        heads: the heads (``config.MODEL.HEAD.PARAMS``), in chain order.
        collator: ``config.DATA.TRAIN.COLLATE_FUNCTION`` of its configs.
        transforms: the method's own transforms (the generic crops and jitters left out).
        hooks: the hook classes its loss asks for (``loss.required_hooks()``), by class name.
        teacher: the attribute of the loss that holds its frozen copy, by VISSL's name
            (its checkpoint key ``loss.<teacher>.*``; ``None``: the method has no copy).
            Every name is the same :class:`~vissl.models.momentum.MomentumTeacher` copy;
            a loss driven by ``MomentumTeacherHook`` also has it as ``loss.teacher``.
        configs: its quick, digits and ImageNet configs.
        docs: its page under ``docs/``.
    """

    name: str
    title: str
    paper: str
    loss: tuple[str, ...]
    trunks: tuple[str, ...]
    heads: tuple[str, ...]
    collator: str | None
    configs: MethodConfigs
    docs: str
    transforms: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    teacher: str | None = None

    @property
    def has_teacher(self) -> bool:
        return self.teacher is not None


def _quick(*names: str) -> tuple[str, ...]:
    return tuple(f"test/integration_test/{n}" for n in names)


def _pretrain(folder: str, *names: str) -> tuple[str, ...]:
    return tuple(f"pretrain/{folder}/{n}" for n in names)


_RES = ("resnet",)
_VIT = ("vision_transformer",)
_TWO_VIEWS = ("ImgReplicatePil",)
_MULTICROP = ("ImgPilToMultiCrop",)

METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        name="simclr",
        title="SimCLR",
        paper="Chen et al., 2020",
        loss=("simclr_info_nce_loss",),
        trunks=_RES,
        heads=("mlp",),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        configs=MethodConfigs(
            quick=("quick_start", *_quick("quick_simclr_cosine_warm_restart")),
            digits=("quick_start",),
            pretrain=_pretrain("simclr", "simclr_8gpu_resnet", "simclr_64gpu_resnet"),
        ),
        docs="getting_started.md",
    ),
    MethodSpec(
        name="simclr_multicrop",
        title="Multi-crop SimCLR",
        paper="Caron et al., 2020 (SwAV's multi-crop)",
        loss=("multicrop_simclr_info_nce_loss",),
        trunks=_RES,
        heads=("mlp", "mlp"),
        collator="multicrop_collator",
        transforms=_MULTICROP,
        configs=MethodConfigs(
            quick=_quick("quick_simclr_multicrop"),
            digits=("digits/simclr_multicrop",),
            pretrain=_pretrain("simclr", "simclr_multicrop_64gpu_resnet"),
        ),
        docs="methods/simclr_multicrop.md",
    ),
    MethodSpec(
        name="moco",
        title="MoCo v2",
        paper="Chen et al., 2020",
        loss=("moco_loss",),
        trunks=_RES,
        heads=("mlp", "mlp"),
        collator="moco_collator",
        transforms=_TWO_VIEWS,
        hooks=("MomentumTeacherHook",),
        teacher="momentum_encoder",
        configs=MethodConfigs(
            quick=_quick("quick_moco"),
            digits=("digits/moco",),
            pretrain=_pretrain("moco", "moco_v2_8gpu_resnet", "moco_v2_64gpu_resnet"),
        ),
        docs="methods/moco.md",
    ),
    MethodSpec(
        name="swav",
        title="SwAV",
        paper="Caron et al., 2020",
        loss=("swav_loss", "swav_momentum_loss"),
        trunks=_RES,
        heads=("swav_head",),
        collator="multicrop_collator",
        transforms=_MULTICROP,
        hooks=("SwAVTrackingHook", "NormalizePrototypesHook", "SwAVMomentumHook"),
        teacher="momentum_encoder",  # swav_momentum_loss only
        configs=MethodConfigs(
            quick=_quick(
                "quick_swav", "quick_swav_multicrop", "quick_swav_queue", "quick_swav_momentum"
            ),
            digits=("digits/swav",),
            pretrain=_pretrain("swav", "swav_8gpu_resnet", "swav_64gpu_resnet"),
        ),
        docs="methods/swav.md",
    ),
    MethodSpec(
        name="deepcluster_v2",
        title="DeepCluster-v2",
        paper="Caron et al., 2020",
        loss=("deepclusterv2_loss",),
        trunks=_RES,
        heads=("swav_head",),
        collator="multicrop_collator",
        transforms=_MULTICROP,
        hooks=("InitMemoryHook", "ClusterMemoryHook"),
        configs=MethodConfigs(
            quick=_quick("quick_deepcluster_v2"),
            digits=("digits/deepcluster_v2",),
            pretrain=_pretrain(
                "deepcluster_v2", "deepclusterv2_8gpu_resnet50", "deepclusterv2_64gpu_resnet50"
            ),
        ),
        docs="methods/deepcluster_v2.md",
    ),
    MethodSpec(
        name="dino",
        title="DINO",
        paper="Caron et al., 2021",
        loss=("dino_loss",),
        trunks=("resnet", "vision_transformer"),
        heads=("dino_head",),
        collator="multicrop_collator",
        transforms=_MULTICROP,
        hooks=("MomentumTeacherHook",),
        teacher="teacher",
        configs=MethodConfigs(
            quick=_quick("quick_dino", "quick_dino_vit"),
            digits=("digits/dino", "digits/dino_vit"),
            pretrain=_pretrain(
                "dino",
                "dino_8gpu_resnet50",
                "dino_64gpu_resnet50",
                "dino_8gpu_vits16",
                "dino_64gpu_vits16",
            ),
        ),
        docs="methods/dino.md",
    ),
    MethodSpec(
        name="barlow_twins",
        title="Barlow Twins",
        paper="Zbontar et al., 2021",
        loss=("barlow_twins_loss",),
        trunks=_RES,
        heads=("mlp",),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        configs=MethodConfigs(
            quick=_quick("quick_barlow_twins"),
            digits=("digits/barlow_twins",),
            pretrain=_pretrain(
                "barlow_twins", "barlow_twins_8gpu_resnet", "barlow_twins_64gpu_resnet"
            ),
        ),
        docs="methods/barlow_twins.md",
    ),
    MethodSpec(
        name="byol",
        title="BYOL",
        paper="Grill et al., 2020",
        loss=("byol_loss",),
        trunks=_RES,
        heads=("mlp", "mlp"),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        hooks=("MomentumTeacherHook",),
        teacher="target_network",
        configs=MethodConfigs(
            quick=_quick("quick_byol"),
            digits=("digits/byol",),
            pretrain=_pretrain("byol", "byol_8gpu_resnet50", "byol_64gpu_resnet50"),
        ),
        docs="methods/byol.md",
    ),
    MethodSpec(
        name="simsiam",
        title="SimSiam",
        paper="Chen and He, 2021",
        loss=("simsiam_loss",),
        trunks=_RES,
        heads=("mlp", "mlp"),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        hooks=("SimSiamCollapseHook",),
        configs=MethodConfigs(
            quick=_quick("quick_simsiam"),
            digits=("digits/simsiam",),
            pretrain=_pretrain("simsiam", "simsiam_8gpu_resnet50", "simsiam_64gpu_resnet50"),
        ),
        docs="methods/simsiam.md",
    ),
    MethodSpec(
        name="moco_v3",
        title="MoCo v3",
        paper="Chen et al., 2021",
        loss=("moco_v3_loss",),
        trunks=("resnet", "vision_transformer"),
        heads=("mlp", "mlp"),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        hooks=("MomentumTeacherHook",),
        teacher="target_network",
        configs=MethodConfigs(
            quick=_quick("quick_moco_v3", "quick_moco_v3_vit"),
            digits=("digits/moco_v3",),
            pretrain=_pretrain(
                "moco_v3",
                "moco_v3_8gpu_resnet50",
                "moco_v3_64gpu_resnet50",
                "moco_v3_8gpu_vits16",
                "moco_v3_64gpu_vits16",
            ),
        ),
        docs="methods/moco_v3.md",
    ),
    MethodSpec(
        name="vicreg",
        title="VICReg",
        paper="Bardes et al., 2022",
        loss=("vicreg_loss",),
        trunks=_RES,
        heads=("mlp", "mlp", "mlp"),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        configs=MethodConfigs(
            quick=_quick("quick_vicreg"),
            digits=("digits/vicreg",),
            pretrain=_pretrain("vicreg", "vicreg_8gpu_resnet", "vicreg_64gpu_resnet"),
        ),
        docs="methods/vicreg.md",
    ),
    MethodSpec(
        name="nnclr",
        title="NNCLR",
        paper="Dwibedi et al., 2021",
        loss=("nnclr_loss", "nnclr_info_nce_loss"),
        trunks=_RES,
        heads=("mlp", "mlp"),
        collator="simclr_collator",
        transforms=_TWO_VIEWS,
        configs=MethodConfigs(
            quick=_quick("quick_nnclr"),
            digits=("digits/nnclr",),
            pretrain=_pretrain("nnclr", "nnclr_8gpu_resnet50", "nnclr_64gpu_resnet50"),
        ),
        docs="methods/nnclr.md",
    ),
    MethodSpec(
        name="npid",
        title="NPID and NPID++",
        paper="Wu et al., 2018; Misra and van der Maaten, 2020",
        loss=("nce_loss_with_memory",),
        trunks=_RES,
        heads=("mlp",),
        collator=None,
        configs=MethodConfigs(
            quick=_quick("quick_npid"),
            digits=("digits/npid",),
            pretrain=_pretrain(
                "npid",
                "npid_8gpu_resnet50",
                "npid_64gpu_resnet50",
                "npid++_8gpu_resnet50",
                "npid++_4nodes_resnet",
            ),
        ),
        docs="methods/npid.md",
    ),
    MethodSpec(
        name="pirl",
        title="PIRL",
        paper="Misra and van der Maaten, 2020",
        loss=("nce_loss_with_memory",),
        trunks=_RES,
        heads=("mlp", "siamese_concat_view", "mlp"),
        collator="patch_and_image_collator",
        transforms=("ImgPilToPatchesAndImage",),
        configs=MethodConfigs(
            quick=_quick("quick_pirl"),
            digits=("digits/pirl",),
            pretrain=_pretrain("pirl", "pirl_8gpu_resnet50", "pirl_64gpu_resnet50"),
        ),
        docs="methods/pirl.md",
    ),
    MethodSpec(
        name="rotnet",
        title="RotNet",
        paper="Gidaris et al., 2018",
        loss=("cross_entropy_multiple_output_single_target",),
        trunks=_RES,
        heads=("mlp",),
        collator="rotnet_collator",
        configs=MethodConfigs(
            quick=_quick("quick_rotnet"),
            digits=("digits/rotnet",),
            pretrain=_pretrain("rotnet", "rotnet_8gpu_resnet50", "rotnet_64gpu_resnet50"),
        ),
        docs="methods/rotnet.md",
    ),
    MethodSpec(
        name="jigsaw",
        title="Jigsaw",
        paper="Noroozi and Favaro, 2016",
        loss=("cross_entropy_multiple_output_single_target",),
        trunks=_RES,
        heads=("mlp", "siamese_concat_view", "mlp"),
        collator="siamese_collator",
        transforms=("ImgPatchesFromTensor", "ShuffleImgPatches"),
        configs=MethodConfigs(
            quick=_quick("quick_jigsaw"),
            digits=("digits/jigsaw",),
            pretrain=_pretrain("jigsaw", "jigsaw_8gpu_resnet50", "jigsaw_64gpu_resnet50"),
        ),
        docs="methods/jigsaw.md",
    ),
    MethodSpec(
        name="colorization",
        title="Colorization",
        paper="Zhang et al., 2016",
        loss=("colorization_loss",),
        trunks=("alexnet_colorization",),
        heads=("colorization_head",),
        collator="colorization_collator",
        transforms=("ImgPil2LabTensor",),
        configs=MethodConfigs(
            quick=_quick("quick_colorization"),
            digits=("digits/colorization",),
            pretrain=_pretrain(
                "colorization", "colorization_8gpu_alexnet", "colorization_64gpu_alexnet"
            ),
        ),
        docs="methods/colorization.md",
    ),
    MethodSpec(
        name="clusterfit",
        title="ClusterFit",
        paper="Yan et al., 2020",
        loss=("cross_entropy_multiple_output_single_target",),
        trunks=_RES,
        heads=("mlp",),
        collator=None,
        configs=MethodConfigs(
            digits=("digits/clusterfit_features", "digits/clusterfit"),
            pretrain=_pretrain(
                "clusterfit",
                "cluster_features_resnet50_8gpu_imagenet",
                "clusterfit_8gpu_resnet50",
                "clusterfit_64gpu_resnet50",
            ),
        ),
        docs="methods/clusterfit.md",
    ),
    MethodSpec(
        name="mae",
        title="MAE",
        paper="He et al., 2022",
        loss=("mae_loss",),
        trunks=_VIT,
        heads=("mae_decoder",),
        collator="default_collate",
        transforms=("RandomPatchMasking",),
        configs=MethodConfigs(
            quick=_quick("quick_mae"),
            digits=("digits/mae",),
            pretrain=_pretrain("mae", "mae_8gpu_vits16", "mae_8gpu_vitb16"),
        ),
        docs="methods/mae.md",
    ),
    MethodSpec(
        name="ibot",
        title="iBOT",
        paper="Zhou et al., 2022",
        loss=("ibot_loss",),
        trunks=_VIT,
        heads=("ibot_head",),
        collator="ibot_multicrop_masking_collator",
        transforms=(*_MULTICROP, "MaskedImageModeling"),
        hooks=("MomentumTeacherHook",),
        teacher="teacher",
        configs=MethodConfigs(
            quick=_quick("quick_ibot"),
            digits=("digits/ibot",),
            pretrain=_pretrain("ibot", "ibot_8gpu_vits16", "ibot_8gpu_vitb16"),
        ),
        docs="methods/ibot.md",
    ),
    MethodSpec(
        name="dinov2",
        title="DINOv2",
        paper="Oquab et al., 2024",
        loss=("dinov2_loss",),
        trunks=_VIT,
        heads=("ibot_head",),
        collator="ibot_multicrop_masking_collator",
        transforms=(*_MULTICROP, "MaskedImageModeling"),
        hooks=("MomentumTeacherHook",),
        teacher="teacher",
        configs=MethodConfigs(
            quick=_quick("quick_dinov2"),
            digits=("digits/dinov2",),
            pretrain=_pretrain("dinov2", "dinov2_8gpu_vits16", "dinov2_8gpu_vitb16"),
        ),
        docs="methods/dinov2.md",
    ),
    MethodSpec(
        name="msn",
        title="MSN",
        paper="Assran et al., 2022",
        loss=("msn_loss",),
        trunks=_VIT,
        heads=("msn_head",),
        collator="msn_collator",
        transforms=(*_MULTICROP, "RandomPatchMasking"),
        hooks=("MomentumTeacherHook",),
        teacher="teacher",
        configs=MethodConfigs(
            quick=_quick("quick_msn"),
            digits=("digits/msn",),
            pretrain=_pretrain("msn", "msn_8gpu_vits16", "msn_8gpu_vitb16"),
        ),
        docs="methods/msn.md",
    ),
    MethodSpec(
        name="ijepa",
        title="I-JEPA",
        paper="Assran et al., 2023",
        loss=("ijepa_loss",),
        trunks=_VIT,
        heads=("ijepa_predictor",),
        collator="ijepa_multiblock_collator",
        hooks=("MomentumTeacherHook",),
        teacher="target_encoder",
        configs=MethodConfigs(
            quick=_quick("quick_ijepa"),
            digits=("digits/ijepa",),
            pretrain=_pretrain("ijepa", "ijepa_8gpu_vits16", "ijepa_8gpu_vitb16"),
        ),
        docs="methods/ijepa.md",
    ),
)

_BY_NAME = {m.name: m for m in METHODS}


def method_names() -> list[str]:
    """The index's keys, in the index's order."""
    return [m.name for m in METHODS]


def get_method(name: str) -> MethodSpec:
    """The index entry of ``name``.

    Raises:
        UnknownNameError: no method of that name (the error lists them all).
    """
    if name not in _BY_NAME:
        raise UnknownNameError(
            f"no method named {name!r} in vissl.methods.METHODS; known: {method_names()}"
        )
    return _BY_NAME[name]


def loss_source(name: str) -> str:
    """The repository-relative file of a registered loss (for the docs table)."""
    from vissl.losses import get_loss

    module = importlib.import_module(get_loss(name).__module__)
    path = inspect.getfile(module)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.relpath(path, root)
