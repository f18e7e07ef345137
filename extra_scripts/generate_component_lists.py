#!/usr/bin/env python3
"""Write the lists of built-in components in the docs from vissl's registries.

    python extra_scripts/generate_component_lists.py            # rewrite the blocks
    python extra_scripts/generate_component_lists.py --check    # exit 1 if one is stale

Two blocks are generated, each between ``<!-- generated: NAME -->`` and
``<!-- /generated: NAME -->`` (the script owns what is between the markers):

- ``components`` in ``docs/components.md``: every registry (its config key, how many
  names, every name), read after ``import_vissl_plugins()`` registered everything;
- ``vissl-components`` in ``docs/migrating_from_vissl.md``: how many of each kind vissl
  ships, and which of VISSL's own names (:data:`VISSL_NAMES`, read from VISSL's
  registrations) vissl does not have.

``tests/docs/test_component_lists.py`` fails when a committed block differs from this
script's output: register a component, then run this script.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = "extra_scripts/generate_component_lists.py"


@dataclass(frozen=True)
class Kind:
    """One registry as the docs name it."""

    registry: str  # the Registry's name
    label: str  # plural, as the page says it
    note: str = ""  # after the names (what a fallback accepts, a page)


KINDS = (
    Kind("train step", "train steps"),
    Kind("engine", "engines"),
    Kind("model", "models"),
    Kind(
        "model trunk",
        "trunks",
        "see [Trunks](models/trunks.md#vissls-named-trunks); `timm` takes any timm model",
    ),
    Kind("model head", "heads"),
    Kind("loss", "losses", "plus every `torch.nn` loss by class name"),
    Kind("data source", "data sources"),
    Kind("transform", "transforms", "plus every `torchvision.transforms` class by name"),
    Kind("collator", "collators"),
    Kind(
        "param group constructor",
        "param-group constructors",
        "see [Supervised recipes](supervised_recipes.md)",
    ),
    Kind("meter", "meters"),
    Kind("optimizer", "optimizers", "each with `use_larc`"),
    Kind("param scheduler", "param schedulers"),
    Kind(
        "hook",
        "hooks",
        "the default hooks are switched on by their own keys ([Hooks](hooks.md#default-hooks))",
    ),
)

#: VISSL's registered names (facebookresearch/vissl main, 09270ed: its ``@register_*``
#: decorators), for the list of what vissl lacks.
VISSL_NAMES: dict[str, tuple[str, ...]] = {
    "model trunk": (
        "alexnet_bvlc alexnet_colorization alexnet_deepcluster alexnet_jigsaw alexnet_rotnet "
        "beit classy_vit convit convnext efficientnet mobilenetv3_timm mobilenetv3_tv regnet "
        "regnet_fsdp regnet_v2 resnet resnet_sk swin_transformer swin_transformer_official "
        "vision_transformer vision_transformer_fsdp xcit xcit_fsdp"
    ).split(),
    "model head": (
        "dino_head dino_head_fsdp eval_mlp eval_mlp_fsdp eval_mlp_pooled ibot_distillation_head "
        "ibot_head identity mlp mlp_fsdp mlp_res mobilenet_v3_head mobilenet_v3_head_timm "
        "msn_head siamese_concat_view swav_head swav_head_fsdp vision_transformer_head"
    ).split(),
    "loss": (
        "barlow_twins_loss bce_logits_multiple_output_single_target "
        "cross_entropy_multiple_output_single_target deepclusterv2_loss "
        "dino_distillation_loss dino_loss distillation_loss ibot_distillation_loss ibot_loss "
        "moco_loss msn_distillation_loss msn_loss multicrop_simclr_info_nce_loss "
        "nce_loss_with_memory simclr_info_nce_loss swav_distillation_loss swav_loss "
        "swav_momentum_loss"
    ).split(),
    "collator": (
        "cutmixup_collator ibot_multicrop_masking_collator identity_collator moco_collator "
        "multicrop_collator multicrop_mixup_collator patch_and_image_collator siamese_collator "
        "simclr_collator targets_one_hot_default_collator"
    ).split(),
    "transform": (
        "ImgPatchesFromTensor ImgPil2LabTensor ImgPilColorDistortion ImgPilGaussianBlur "
        "ImgPilMultiCropRandomApply ImgPilRandomColorJitter ImgPilRandomPhotometric "
        "ImgPilRandomSolarize ImgPilResizeLargerSide ImgPilToMultiCrop ImgPilToPatchesAndImage "
        "ImgPilToRawTensor ImgReplicatePil ImgRotatePil ImgToTensor MNISTImgPil2RGB "
        "MaskedImageModeling OneHotEncode RandAugment ShuffleImgPatches VisslAutoAugment"
    ).split(),
}

#: page -> the blocks it holds
PAGES = {
    "components": ROOT / "docs" / "components.md",
    "vissl-components": ROOT / "docs" / "migrating_from_vissl.md",
}


def _registries() -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    from vissl.utils.imports import import_vissl_plugins
    from vissl.utils.registry import get_registry

    import_vissl_plugins()
    found = {}
    for kind in KINDS:
        registry = get_registry(kind.registry)
        if registry is None:
            raise SystemExit(f"error: no registry named {kind.registry!r}")
        found[kind.registry] = registry
    return found


def _names(registry: object) -> list[str]:
    """The built-in names: those vissl's own modules registered (not a test's or a user's
    plugin registered in this process)."""
    return [
        name
        for name in registry.names()  # type: ignore[attr-defined]
        if registry.origin(name).startswith("vissl.")  # type: ignore[attr-defined]
    ]


def _accepts(registry: object, name: str) -> bool:
    """Whether vissl accepts ``name``: built in, or resolved by a fallback (torchvision's
    transforms, torch.nn's losses)."""
    if name in registry:  # type: ignore[operator]
        return name in _names(registry)
    try:
        registry.get(name)  # type: ignore[attr-defined]
    except Exception:
        return False
    return True


def _code(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render_components(registries: dict[str, object]) -> str:
    """The table of every registry for docs/components.md."""
    rows = [
        f"<!-- {GENERATOR} writes this table from the registries; do not edit it by hand -->",
        "| Registry (selected by) | Built-in names |",
        "|---|---|",
    ]
    for kind in KINDS:
        registry = registries[kind.registry]
        names = _names(registry)
        key = getattr(registry, "config_key", None)
        label = f"{kind.label} (`{key}`)" if key else kind.label
        cell = f"{len(names)}: {_code(names)}" if names else "none"
        if kind.note:
            cell += f"; {kind.note}"
        rows.append(f"| {label} | {cell} |")
    return "\n".join(rows)


def render_vissl_comparison(registries: dict[str, object]) -> str:
    """The "Components" item of docs/migrating_from_vissl.md."""
    counts = ", ".join(
        f"{len(_names(registries[k.registry]))} {k.label}"
        for k in KINDS
        if k.registry in ("model trunk", "model head", "loss", "collator", "transform")
    )
    missing = []
    for kind in KINDS:
        vissl_names = VISSL_NAMES.get(kind.registry)
        if not vissl_names:
            continue
        lacking = [n for n in vissl_names if not _accepts(registries[kind.registry], n)]
        if lacking:
            missing.append(f"{kind.label} {_code(lacking)}")
    lacks = "; ".join(missing) if missing else "none"
    return (
        f"<!-- {GENERATOR} writes this item from the registries; do not edit it by hand -->\n"
        f"- **Components.** vissl ships {counts} (and more kinds: every name is in "
        "[Built-in components](components.md), generated from the registries). Of VISSL's "
        f"registered names, vissl lacks: {lacks}."
    )


RENDER = {"components": render_components, "vissl-components": render_vissl_comparison}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(<!-- /generated: {re.escape(name)} -->)",
        re.S,
    )


def updated_pages() -> dict[Path, tuple[str, str]]:
    """``page -> (current text, text with its blocks regenerated)``."""
    registries = _registries()
    out: dict[Path, tuple[str, str]] = {}
    for name, page in PAGES.items():
        current = out.get(page, (page.read_text(encoding="utf-8"),) * 2)[1]
        pattern = _block(name)
        if not pattern.search(current):
            raise SystemExit(f"error: {page} has no <!-- generated: {name} --> block")
        body = RENDER[name](registries) + "\n"
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(3), current)
        out[page] = (page.read_text(encoding="utf-8"), text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args(argv)
    stale = []
    for page, (current, text) in updated_pages().items():
        if current == text:
            continue
        stale.append(page)
        if not args.check:
            page.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {[str(p.relative_to(ROOT)) for p in stale]}; run python {GENERATOR}")
        return 1
    for page in stale:
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
