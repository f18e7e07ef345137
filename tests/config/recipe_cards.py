"""Recipe cards: the authors' published ImageNet settings of every method, field by field.

One :class:`Card` per method (the docs page ``docs/methods/<page>.md`` it belongs to), each
a table of :class:`Row` s: a field, the authors' value, and the file it was read from. The
values are the AUTHORS', read from their code and configs (or the paper where they have no
code), never ours. ``tests/config/test_recipe_cards.py`` checks every row against each of
the card's configs as composed; a row whose ``ours`` is set is a deliberate difference: our
value is checked to be ``ours``, and ``why`` is shown on the method's docs page, in the
"Recipe card" section that :func:`render_page_section` writes (run this module to rewrite
those sections: ``PYTHONPATH=. python tests/config/recipe_cards.py``).

Fields (see ``tests/config/_recipe_probes.py`` for how each is read from our configs):

- ``optimizer``: ``sgd``, ``lars`` (You et al.; the trust ratio from ``||w||/||g + wd w||``),
  ``larc`` (apex's LARC around SGD, as VISSL and SwAV use it), ``adamw``;
- ``lr``: an :class:`Lr` (base value, reference batch, scaling rule), checked as the peak of
  our built lr schedule at the config's own global batch;
- ``warmup_epochs``, ``warmup_start`` (first lr as a fraction of the peak), ``lr_schedule``
  (a :class:`Sched` of what follows the warm-up);
- ``weight_decay`` (a number, or a :class:`Sched`), ``wd_exempt`` (``norm`` layers,
  ``bias`` es, named parameters), ``trust_ratio_exempt``, ``trust_coefficient``;
- ``batch_size`` (global, images), ``epochs``, ``crops`` (``((number, size, (min scale, max
  scale)), ...)``), ``grad_clip`` (``none`` or ``<mode> <max norm>``, modes as ``MODEL.GRAD_CLIP.MODE``), ``zero_init_residual``;
- ``head``: the layers of the built heads (``Linear 2048-2048, BN, ReLU, ...``; ``BN (no
  affine)``; ``→`` marks where one of our head modules ends and the next begins, ``|``
  separates parallel heads);
- any other field is a dotted key under ``config`` (``LOSS.swav_loss.temperature``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
METHODS_DOCS = REPO / "docs" / "methods"
SECTION = "## Recipe card"


#: the table's names of the fields read by a probe (other fields name a config key)
FIELD_LABELS = {
    "optimizer": "optimizer",
    "lr": "lr (base, scaling rule)",
    "warmup_epochs": "warm-up epochs",
    "warmup_start": "warm-up start (x peak lr)",
    "lr_schedule": "lr after the warm-up",
    "weight_decay": "weight decay",
    "wd_exempt": "no weight decay on",
    "trust_ratio_exempt": "no LARS trust ratio on",
    "trust_coefficient": "LARS trust coefficient",
    "batch_size": "batch size (images)",
    "epochs": "epochs",
    "crops": "crops (number x size, scale)",
    "grad_clip": "gradient clipping",
    "zero_init_residual": "zero-init last BN of each residual block",
    "head": "head layers",
}


class _Same:
    def __repr__(self) -> str:
        return "SAME"


#: ``Row.ours`` default: our value is the authors'.
SAME: Any = _Same()


@dataclass(frozen=True)
class Lr:
    """A learning rate ``base`` per ``per`` images, scaled with the batch by ``rule``."""

    base: float
    per: int = 256
    rule: str = "linear"  # linear | sqrt | none (the same lr at every batch size)

    def at(self, batch: int) -> float:
        if self.rule == "linear":
            return self.base * batch / self.per
        if self.rule == "sqrt":
            return self.base * math.sqrt(batch / self.per)
        if self.rule == "none":
            return self.base
        raise ValueError(f"unknown lr scaling rule {self.rule!r}")

    def __str__(self) -> str:
        if self.rule == "none":
            return f"{self.base:g} (at batch {self.per}, not scaled)"
        return f"{self.base:g} per {self.per} ({self.rule} scaling)"


@dataclass(frozen=True)
class Sched:
    """A schedule's shape and the values that matter; ``None`` fields are not checked.

    ``end_rel`` is the end value as a fraction of the start value (the peak, after a
    warm-up).
    """

    shape: str  # cosine | linear | steps | constant | other
    start: float | None = None
    end: float | None = None
    end_rel: float | None = None
    milestones: tuple[int, ...] | None = None
    gamma: float | None = None

    def __str__(self) -> str:
        if self.shape == "constant":
            return "constant" if self.start is None else f"constant {self.start:g}"
        if self.shape == "steps":
            at = ", ".join(str(m) for m in self.milestones or ())
            return f"steps x{self.gamma:g} at epochs {at}"
        start = "" if self.start is None else f"{self.start:g} "
        if self.end_rel is not None:
            end = "0" if self.end_rel == 0 else f"{self.end_rel:g} x peak"
        elif self.end is not None:
            end = f"{self.end:g}"
        else:
            end = "?"
        return f"{self.shape} {start}to {end}"


@dataclass(frozen=True)
class Row:
    """One setting: the authors' value and where it was read.

    Args:
        field: what is compared (see the module docstring).
        theirs: the authors' value.
        source: the file (and flag / line) it was read from, short: the card's
            ``sources`` name the repositories.
        ours: a deliberate difference: our value (for every config), or a mapping from
            config names (the last path part, e.g. ``swav_8gpu_resnet``) to our value in
            those configs (the others must equal ``theirs``).
        why: the reason for the difference (required with ``ours``).
        label: the setting's name in the table (default: ``field``).
    """

    field: str
    theirs: Any
    source: str
    ours: Any = SAME
    why: str = ""
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or FIELD_LABELS.get(self.field, self.field)

    def expected(self, config: str) -> Any:
        """What our config ``config`` must hold: ``theirs`` unless a difference is recorded."""
        short = config.rsplit("/", 1)[-1]
        if self.ours is SAME:
            return self.theirs
        if isinstance(self.ours, dict):
            return self.ours.get(short, self.theirs)
        return self.ours

    def differs_in(self, config: str) -> bool:
        short = config.rsplit("/", 1)[-1]
        if self.ours is SAME:
            return False
        return short in self.ours if isinstance(self.ours, dict) else True


@dataclass(frozen=True)
class Card:
    """The authors' recipe of one method, and the configs of ours it is checked against."""

    method: str
    page: str  # docs/methods/<page>.md
    title: str
    configs: tuple[str, ...]
    sources: tuple[str, ...]
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- rendering
def show(value: Any) -> str:
    """A card value as the docs table writes it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (Lr, Sched)):
        return str(value)
    if isinstance(value, tuple) and value and all(_is_crop(v) for v in value):
        return " + ".join(f"{n} x {s} px ({lo:g}-{hi:g})" for n, s, (lo, hi) in value)
    if isinstance(value, tuple):
        return ", ".join(show(v) for v in value) if value else "none"
    if value is None:
        return "-"
    return str(value)


def _is_crop(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) == 3 and isinstance(v[2], tuple)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_card(card: Card, heading: str = "") -> str:
    lines = []
    if heading:
        lines += [heading, ""]
    configs = ", ".join(f"`{c}`" for c in card.configs)
    lines += [
        f"{card.title}: the authors' settings, each checked by "
        f"`tests/config/test_recipe_cards.py` against {configs} as composed (the learning "
        "rate at each config's own global batch, scaled by the authors' rule; the heads as "
        "built).",
        "",
        "Read from:",
        "",
        *[f"- {s}" for s in card.sources],
        "",
        "| setting | authors | source |",
        "|---|---|---|",
    ]
    for row in card.rows:
        lines.append(f"| {_cell(row.name)} | {_cell(show(row.theirs))} | {_cell(row.source)} |")
    lines.append("")
    diffs = [r for r in card.rows if r.ours is not SAME]
    if diffs:
        lines += ["Deliberate differences:", ""]
        for row in diffs:
            if isinstance(row.ours, dict):
                where = "; ".join(f"`{c}`: {show(v)}" for c, v in row.ours.items())
            else:
                where = f"ours: {show(row.ours)}"
            lines.append(f"- **{row.name}** ({where}): {row.why}")
        lines.append("")
    else:
        lines += ["No deliberate differences.", ""]
    for note in card.notes:
        lines += [note, ""]
    return "\n".join(lines)


def render_page_section(page: str) -> str:
    """The "Recipe card" section of ``docs/methods/<page>.md`` (the end of the page)."""
    cards = [c for c in CARDS if c.page == page]
    lines = [SECTION, ""]
    if len(cards) == 1:
        lines.append(render_card(cards[0]))
    else:
        for card in cards:
            lines.append(render_card(card, heading=f"### {card.method}"))
    return "\n".join(lines).rstrip("\n") + "\n"


def page_section(text: str) -> str | None:
    """The "Recipe card" section of a page's text (from its heading to the end), if any."""
    match = re.search(rf"^{re.escape(SECTION)}$", text, flags=re.M)
    return None if match is None else text[match.start() :]


def write_pages() -> list[Path]:
    """Replace (or append) the "Recipe card" section of every page that has a card."""
    written = []
    for page in sorted({c.page for c in CARDS}):
        path = METHODS_DOCS / f"{page}.md"
        text = path.read_text(encoding="utf-8")
        old = page_section(text)
        body = text[: len(text) - len(old)] if old is not None else text.rstrip("\n") + "\n\n"
        new = body + render_page_section(page)
        if new != text:
            path.write_text(new, encoding="utf-8")
            written.append(path)
    return written


# --------------------------------------------------------------------------- the cards
_RESNET_ZERO_INIT_FALSE = "torchvision `resnet50()` default"

SIMCLR_V1 = (
    "`google-research/simclr` at `be133b3` (the SimCLR v1 code; today's `HEAD` is v2): "
    "`run.py` (flag defaults), `model.py` (optimizer), `model_util.py` (`projection_head`, "
    "`linear_layer`, `learning_rate_schedule`), `lars_optimizer.py`, `data_util.py`"
)
SIMCLR_PAPER = (
    "the SimCLR paper (Chen et al. 2020, arXiv:2002.05709), Sec. 2.3 and Appendix B.9: batch "
    "4096, 100 epochs for the ablations, LARS at 4.8 = 0.3 x batch/256, weight decay 1e-6, "
    "10 warm-up epochs then cosine"
)

_SIMCLR_ROWS = (
    Row("optimizer", "lars", "`model.py`: `LARSOptimizer` (`--optimizer lars`)"),
    Row("OPTIMIZER.momentum", 0.9, "`run.py` `--momentum`", label="momentum"),
    Row("trust_coefficient", 0.001, "`lars_optimizer.py` `EETA_DEFAULT`"),
    Row(
        "trust_ratio_exempt",
        ("bias", "norm"),
        "`model.py`: `exclude_from_weight_decay=['batch_normalization', 'bias']` (also the "
        "layer-adaptation exclusions)",
    ),
    Row("lr", Lr(0.3), "`run.py` `--learning_rate`, `--learning_rate_scaling`; paper B.9"),
    Row("warmup_epochs", 10, "`run.py` `--warmup_epochs`"),
    Row("warmup_start", 0.0, "`model_util.learning_rate_schedule` (linear from 0)"),
    Row("lr_schedule", Sched("cosine", end_rel=0.0), "`model_util.learning_rate_schedule`"),
    Row("weight_decay", 1e-6, "`run.py` `--weight_decay` at `be133b3`; paper B.9"),
    Row("wd_exempt", ("bias", "norm"), "`model.py` `exclude_from_weight_decay`"),
    Row("batch_size", 4096, "paper Sec. 2.3 / B.9"),
    Row("epochs", 100, "`run.py` `--train_epochs`"),
    Row(
        "LOSS.simclr_info_nce_loss.temperature",
        0.1,
        "`run.py` `--temperature`",
        label="temperature",
    ),
    Row(
        "crops",
        ((2, 224, (0.08, 1.0)),),
        "`data_util.py` `crop_and_resize` (`area_range=(0.08, 1.0)`)",
    ),
    Row(
        "head",
        "Linear 2048-2048 (no bias), BN, ReLU → Linear 2048-128 (no bias), BN (scale only)",
        "`model_util.projection_head` and `linear_layer` (`use_bn=True`, bias dropped before "
        "BN; the last BN has `center=False`)",
        ours="Linear 2048-2048 (no bias), BN, ReLU → Linear 2048-128 (no bias), BN",
        why="torch's `BatchNorm1d` has its scale and shift together (`affine`); SimCLR's last "
        "BN keeps the scale and drops the shift. Our last BN has a shift too, initialised at "
        "0 and learnt.",
    ),
    Row("zero_init_residual", False, "`resnet.py` (BN scales initialised at 1)"),
)


def _replace(rows: tuple[Row, ...], *new: Row) -> tuple[Row, ...]:
    """``rows`` with each row of ``new`` in place of the row of the same field."""
    by_field = {r.field: r for r in new}
    missing = set(by_field) - {r.field for r in rows}
    assert not missing, missing
    return tuple(by_field.get(r.field, r) for r in rows)


SIMCLR = Card(
    method="SimCLR",
    page="simclr_multicrop",
    title="SimCLR (ResNet-50)",
    configs=("pretrain/simclr/simclr_8gpu_resnet", "pretrain/simclr/simclr_64gpu_resnet"),
    sources=(SIMCLR_V1, SIMCLR_PAPER),
    rows=_replace(
        _SIMCLR_ROWS,
        Row(
            "batch_size",
            4096,
            "paper Sec. 2.3 / B.9",
            ours={"simclr_8gpu_resnet": 512},
            why="64 per GPU on one node of 8 GPUs; the lr follows linearly. The 64-GPU config "
            "(and `optimization/bs32_16nodes.yaml`) has SimCLR's 4096.",
        ),
    ),
)

SIMCLR_MULTICROP = Card(
    method="Multi-crop SimCLR",
    page="simclr_multicrop",
    title="Multi-crop SimCLR (ResNet-50): SimCLR's recipe with SwAV's multi-crop",
    configs=("pretrain/simclr/simclr_multicrop_64gpu_resnet",),
    sources=(
        SIMCLR_V1,
        SIMCLR_PAPER,
        "`facebookresearch/vissl` `configs/config/pretrain/simclr/transforms/"
        "multicrop_2x160_4x96.yaml` (the SwAV authors' multi-crop for SimCLR, as in the SwAV "
        "paper, Caron et al. 2020, Sec. 4.3)",
    ),
    rows=_replace(
        tuple(
            r
            if r.field != "LOSS.simclr_info_nce_loss.temperature"
            else Row(
                "LOSS.multicrop_simclr_info_nce_loss.temperature", r.theirs, r.source, label=r.label
            )
            for r in _SIMCLR_ROWS
        ),
        Row(
            "crops",
            ((2, 160, (0.08, 1.0)), (4, 96, (0.05, 0.14))),
            "VISSL `simclr/transforms/multicrop_2x160_4x96.yaml`",
            ours=((2, 224, (0.14, 1.0)), (6, 96, (0.05, 0.14))),
            why="SwAV's own crops (`facebookresearch/swav` `scripts/swav_400ep_pretrain.sh`: "
            "2 x 224 px at 0.14-1 + 6 x 96 px at 0.05-0.14), the setting of SwAV's best "
            "results; the page above describes this recipe.",
        ),
    ),
)

MOCO_REPO = (
    "`facebookresearch/moco` at `132aea9` (the last commit with the code; `HEAD` has removed "
    "it): `main_moco.py` (argparse defaults, `--aug-plus` transforms, `adjust_learning_rate`), "
    "`moco/builder.py` (`--mlp` head, shuffle BN), `README.md` (the MoCo v2 command: "
    "`--lr 0.03 --batch-size 256 --mlp --moco-t 0.2 --aug-plus --cos`, 200 epochs)"
)

MOCO_V2 = Card(
    method="MoCo v2",
    page="moco",
    title="MoCo v2 (ResNet-50, 200 epochs)",
    configs=("pretrain/moco/moco_v2_8gpu_resnet", "pretrain/moco/moco_v2_64gpu_resnet"),
    sources=(MOCO_REPO,),
    rows=(
        Row("optimizer", "sgd", "`main_moco.py`: `torch.optim.SGD`"),
        Row("OPTIMIZER.momentum", 0.9, "`main_moco.py` `--momentum`", label="momentum"),
        Row(
            "lr",
            Lr(0.03),
            "`README.md` (`--lr 0.03 --batch-size 256`; linear scaling for other batch sizes)",
        ),
        Row("warmup_epochs", 0, "`main_moco.py` `adjust_learning_rate`"),
        Row(
            "lr_schedule",
            Sched("cosine", end_rel=0.0),
            "`main_moco.py` `adjust_learning_rate` (`--cos`, set once per epoch)",
        ),
        Row("weight_decay", 1e-4, "`main_moco.py` `--wd`"),
        Row("wd_exempt", (), "`main_moco.py`: SGD over `model.parameters()`"),
        Row(
            "batch_size",
            256,
            "`README.md`",
            ours={"moco_v2_64gpu_resnet": 2048},
            why="32 per GPU on 64 GPUs, with the lr scaled linearly (0.24), the rule the "
            "README gives for other batch sizes; the queue stays 65536 keys (32 batches).",
        ),
        Row("epochs", 200, "`README.md` (MoCo v2 200-epoch model)"),
        Row("LOSS.moco_loss.temperature", 0.2, "`README.md` `--moco-t 0.2`", label="temperature"),
        Row("LOSS.moco_loss.queue_size", 65536, "`main_moco.py` `--moco-k`", label="queue"),
        Row(
            "LOSS.moco_loss.momentum",
            0.999,
            "`main_moco.py` `--moco-m` (constant)",
            label="key-encoder momentum",
        ),
        Row("LOSS.moco_loss.embedding_dim", 128, "`main_moco.py` `--moco-dim`", label="dim"),
        Row(
            "LOSS.moco_loss.shuffle_batch",
            True,
            "`moco/builder.py` `_batch_shuffle_ddp`",
            label="shuffle BN",
        ),
        Row(
            "crops",
            ((2, 224, (0.2, 1.0)),),
            "`main_moco.py` `--aug-plus`: `RandomResizedCrop(224, scale=(0.2, 1.0))`",
        ),
        Row(
            "head",
            "Linear 2048-2048, ReLU → Linear 2048-128",
            "`moco/builder.py` (`--mlp`: `Linear, ReLU` before the `fc`)",
        ),
        Row("zero_init_residual", False, _RESNET_ZERO_INIT_FALSE),
    ),
)

SWAV_REPO = (
    "`facebookresearch/swav` at `06b1b7c`: `scripts/swav_400ep_pretrain.sh` (the 4096-batch "
    "recipe; the 100/200/800-epoch scripts differ only in `--epochs`), "
    "`scripts/swav_400ep_bs256_pretrain.sh` (the small-batch recipe), `main_swav.py` "
    "(optimizer, lr schedule, prototype freezing), `src/resnet50.py` (head)"
)

SWAV = Card(
    method="SwAV",
    page="swav",
    title="SwAV (ResNet-50, batch 4096, 400 epochs)",
    configs=("pretrain/swav/swav_8gpu_resnet", "pretrain/swav/swav_64gpu_resnet"),
    sources=(SWAV_REPO,),
    rows=(
        Row(
            "optimizer", "larc", "`main_swav.py`: `LARC(SGD, trust_coefficient=0.001, clip=False)`"
        ),
        Row("OPTIMIZER.momentum", 0.9, "`main_swav.py`", label="momentum"),
        Row("trust_coefficient", 0.001, "`main_swav.py`"),
        Row("lr", Lr(4.8, per=4096), "the script: `--base_lr 4.8` at batch 4096"),
        Row(
            "warmup_epochs",
            10,
            "the script: `--warmup_epochs 10`",
            ours={"swav_8gpu_resnet": 0},
            why="batch 512 on one node: like the authors' small-batch script "
            "(`swav_400ep_bs256_pretrain.sh`, `--warmup_epochs 0`), a cosine from the peak.",
        ),
        Row(
            "warmup_start",
            0.3 / 4.8,
            "the script: `--start_warmup 0.3` (of 4.8)",
            ours={"swav_8gpu_resnet": 1.0},
            why="no warm-up at batch 512 (see the warm-up epochs).",
        ),
        Row(
            "lr_schedule",
            Sched("cosine", end_rel=0.001),
            "`main_swav.py` (`--final_lr 0.0048` of 4.8)",
        ),
        Row("weight_decay", 1e-6, "the script: `--wd 0.000001`"),
        Row("wd_exempt", (), "`main_swav.py`: SGD over `model.parameters()`"),
        Row(
            "batch_size",
            4096,
            "the script: 64 per GPU on 64 GPUs",
            ours={"swav_8gpu_resnet": 512},
            why="one node of 8 GPUs at 64 each; the lr follows linearly (0.6, the authors' "
            "batch-256 script also peaks at 0.6) and a queue (next rows) makes up for the "
            "small batch.",
        ),
        Row(
            "epochs",
            400,
            "the script: `--epochs 400`",
            ours={"swav_8gpu_resnet": 100},
            why="a shorter run for one node (the authors' `swav_100ep_pretrain.sh` length).",
        ),
        Row("LOSS.swav_loss.temperature", 0.1, "the script: `--temperature`", label="temperature"),
        Row("LOSS.swav_loss.epsilon", 0.05, "the script: `--epsilon`", label="Sinkhorn epsilon"),
        Row(
            "LOSS.swav_loss.num_iters",
            3,
            "the script: `--sinkhorn_iterations`",
            label="Sinkhorn iterations",
        ),
        Row(
            "LOSS.swav_loss.crops_for_assign",
            (0, 1),
            "the script: `--crops_for_assign`",
            label="crops for assignment",
        ),
        Row(
            "LOSS.swav_loss.queue.queue_length",
            0,
            "the script: `--queue_length 0`",
            label="queue",
            ours={"swav_8gpu_resnet": 3584},
            why="batch 512: the authors' small-batch script uses a queue (3840 from epoch 15 "
            "at batch 256); ours is 7 global batches (a multiple of the global batch, as "
            "`main_swav.py` rounds it), from epoch 15.",
        ),
        Row(
            "crops",
            ((2, 224, (0.14, 1.0)), (6, 96, (0.05, 0.14))),
            "the script: `--nmb_crops 2 6 --size_crops 224 96 --min_scale_crops 0.14 0.05 "
            "--max_scale_crops 1. 0.14`",
        ),
        Row(
            "head",
            "Linear 2048-2048, BN, ReLU, Linear 2048-128, Linear 128-3000 (no bias)",
            "`src/resnet50.py` (`projection_head`, `prototypes`); `--nmb_prototypes 3000`",
        ),
        Row(
            "epochs_of:MODEL.TEMP_FROZEN_PARAMS_ITER_MAP.0.1",
            1.0,
            "the script: `--freeze_prototypes_niters 313` (one epoch at 4096; the batch-256 "
            "script's 5005 is one epoch at 256)",
            label="prototypes frozen (epochs)",
        ),
        Row(
            "zero_init_residual",
            False,
            "`main_swav.py` / `src/resnet50.py` (`zero_init_residual=False`)",
        ),
    ),
)

BARLOW_REPO = (
    "`facebookresearch/barlowtwins` at `8e8d284`: `main.py` (argparse defaults, `LARS`, "
    "`adjust_learning_rate`, the `BarlowTwins` projector and `bn`), and its first release "
    "`f13c949` (`--scale-loss 1/32` with one lr for every parameter)"
)
BARLOW_PAPER = (
    "the Barlow Twins paper (Zbontar et al., ICML 2021), Sec. 4 (implementation details): "
    "LARS, 1000 epochs, batch 2048, lr 0.2 (weights) and 0.0048 (biases and BN) x batch/256, "
    "10 warm-up epochs, cosine down by 1000x, weight decay 1.5e-6"
)

BARLOW_TWINS = Card(
    method="Barlow Twins",
    page="barlow_twins",
    title="Barlow Twins (ResNet-50, 1000 epochs)",
    configs=(
        "pretrain/barlow_twins/barlow_twins_8gpu_resnet",
        "pretrain/barlow_twins/barlow_twins_64gpu_resnet",
    ),
    sources=(BARLOW_REPO, BARLOW_PAPER),
    rows=(
        Row("optimizer", "lars", "`main.py` `LARS`"),
        Row("OPTIMIZER.momentum", 0.9, "`main.py` `LARS(momentum=0.9)`", label="momentum"),
        Row("trust_coefficient", 0.001, "`main.py` `LARS(eta=0.001)`"),
        Row(
            "trust_ratio_exempt",
            ("bias", "norm"),
            "`main.py` (`lars_adaptation_filter`: `p.ndim == 1`)",
        ),
        Row("wd_exempt", ("bias", "norm"), "`main.py` (`weight_decay_filter`: `p.ndim == 1`)"),
        Row("lr", Lr(0.2), "`main.py` `--learning-rate-weights`, `adjust_learning_rate`"),
        Row(
            "lr_norm_bias",
            Lr(0.0048),
            "`main.py` `--learning-rate-biases` (biases and BN parameters)",
            label="lr of biases and BN (1-D) parameters",
            ours=Lr(0.2),
            why="our param groups cannot give the 1-D parameters their own rate (only the "
            "head can have one); instead the loss is scaled by 0.024 (next row), so that these "
            "parameters, which get plain momentum SGD without weight decay, step by exactly "
            "0.2 x 0.024 = 0.0048 times the unscaled gradient, as in the authors' code.",
        ),
        Row(
            "LOSS.barlow_twins_loss.scale_loss",
            1.0,
            "`main.py` (no loss scale since `046eec3`; the first release had `--scale-loss 1/32`)",
            label="loss scale",
            ours=0.024,
            why="the formulation of the authors' first release and of VISSL's "
            "`barlow_twins_4node_resnet.yaml` (one lr, a scaled loss); with 1-D parameters at "
            "0.2 it gives them the authors' 0.0048 step. LARS normalises the weights' step, "
            "so the scale only changes the weights' balance between gradient and weight decay.",
        ),
        Row("warmup_epochs", 10, "`main.py` `adjust_learning_rate`"),
        Row("warmup_start", 0.0, "`main.py` `adjust_learning_rate` (linear from 0)"),
        Row("lr_schedule", Sched("cosine", end_rel=0.001), "`main.py` `adjust_learning_rate`"),
        Row("weight_decay", 1.5e-6, "paper Sec. 4 (`main.py`'s default is 1e-6)"),
        Row(
            "batch_size",
            2048,
            "`main.py` `--batch-size`; paper",
            ours={"barlow_twins_8gpu_resnet": 512},
            why="64 per GPU on one node of 8 GPUs (the lr follows linearly); the 64-GPU config "
            "has the paper's 2048.",
        ),
        Row("epochs", 1000, "`main.py` `--epochs`"),
        Row("LOSS.barlow_twins_loss.lambda_", 0.0051, "`main.py` `--lambd`", label="lambda"),
        Row(
            "crops",
            ((2, 224, (0.08, 1.0)),),
            "`main.py` `Transform` (`RandomResizedCrop(224)`, bicubic)",
        ),
        Row(
            "head",
            "Linear 2048-8192 (no bias), BN, ReLU → Linear 8192-8192 (no bias), BN, ReLU → "
            "Linear 8192-8192 (no bias)",
            "`main.py` `BarlowTwins.__init__` (`--projector 8192-8192-8192`; the loss's "
            "`BatchNorm1d(affine=False)` is in our loss)",
        ),
        Row("zero_init_residual", True, "`main.py`: `resnet50(zero_init_residual=True)`"),
    ),
)

VICREG_REPO = (
    "`facebookresearch/vicreg` at `4e12602`: `main_vicreg.py` (argparse defaults, `LARS`, "
    "`exclude_bias_and_norm`, `adjust_learning_rate`, `Projector`, the loss), "
    "`augmentations.py`, `README.md` (the 8-GPU command: `--epochs 100 --batch-size 512 "
    "--base-lr 0.3`; the 32-GPU one: `--epochs 1000 --batch-size 2048 --base-lr 0.2`)"
)


def _vicreg_rows(lr: float, batch: int, epochs: int, readme: str) -> tuple[Row, ...]:
    return (
        Row("optimizer", "lars", "`main_vicreg.py` `LARS`"),
        Row("OPTIMIZER.momentum", 0.9, "`main_vicreg.py` `LARS(momentum=0.9)`", label="momentum"),
        Row("trust_coefficient", 0.001, "`main_vicreg.py` `LARS(eta=0.001)`"),
        Row(
            "trust_ratio_exempt",
            ("bias", "norm"),
            "`main_vicreg.py` `lars_adaptation_filter=exclude_bias_and_norm`",
        ),
        Row(
            "wd_exempt",
            ("bias", "norm"),
            "`main_vicreg.py` `weight_decay_filter=exclude_bias_and_norm`",
        ),
        Row("lr", Lr(lr), f"{readme} `--base-lr {lr:g}`; `adjust_learning_rate`"),
        Row("warmup_epochs", 10, "`main_vicreg.py` `adjust_learning_rate`"),
        Row("warmup_start", 0.0, "`main_vicreg.py` `adjust_learning_rate`"),
        Row(
            "lr_schedule", Sched("cosine", end_rel=0.001), "`main_vicreg.py` `adjust_learning_rate`"
        ),
        Row("weight_decay", 1e-6, "`main_vicreg.py` `--wd`"),
        Row("batch_size", batch, f"{readme} `--batch-size {batch}`"),
        Row("epochs", epochs, f"{readme} `--epochs {epochs}`"),
        Row(
            "LOSS.vicreg_loss.sim_coeff",
            25.0,
            "`main_vicreg.py` `--sim-coeff`",
            label="invariance coefficient",
        ),
        Row(
            "LOSS.vicreg_loss.std_coeff",
            25.0,
            "`main_vicreg.py` `--std-coeff`",
            label="variance coefficient",
        ),
        Row(
            "LOSS.vicreg_loss.cov_coeff",
            1.0,
            "`main_vicreg.py` `--cov-coeff`",
            label="covariance coefficient",
        ),
        Row(
            "LOSS.vicreg_loss.eps",
            0.0001,
            "`main_vicreg.py` `VICReg.forward` (`sqrt(var + 0.0001)`)",
            label="variance epsilon",
        ),
        Row(
            "crops",
            ((2, 224, (0.08, 1.0)),),
            "`augmentations.py` (`RandomResizedCrop(224)`, bicubic)",
        ),
        Row(
            "head",
            "Linear 2048-8192, BN, ReLU → Linear 8192-8192, BN, ReLU → Linear 8192-8192 (no bias)",
            "`main_vicreg.py` `Projector` (`--mlp 8192-8192-8192`)",
        ),
        Row("zero_init_residual", True, "`main_vicreg.py`: `resnet50(zero_init_residual=True)`"),
    )


VICREG_100 = Card(
    method="VICReg, 100 epochs",
    page="vicreg",
    title="VICReg (ResNet-50), the authors' single-node recipe",
    configs=("pretrain/vicreg/vicreg_8gpu_resnet",),
    sources=(VICREG_REPO,),
    rows=_vicreg_rows(0.3, 512, 100, "`README.md` (8 GPUs):"),
)

VICREG_1000 = Card(
    method="VICReg, 1000 epochs",
    page="vicreg",
    title="VICReg (ResNet-50), the paper's 1000-epoch recipe",
    configs=("pretrain/vicreg/vicreg_64gpu_resnet",),
    sources=(VICREG_REPO,),
    rows=_vicreg_rows(0.2, 2048, 1000, "`README.md` (4 nodes):"),
)

DEEPCLUSTER_V2 = Card(
    method="DeepCluster-v2",
    page="deepcluster_v2",
    title="DeepCluster-v2 (ResNet-50, batch 4096, 800 epochs)",
    configs=(
        "pretrain/deepcluster_v2/deepclusterv2_8gpu_resnet50",
        "pretrain/deepcluster_v2/deepclusterv2_64gpu_resnet50",
    ),
    sources=(
        "`facebookresearch/swav` at `06b1b7c`: `scripts/deepclusterv2_800ep_pretrain.sh`, "
        "`scripts/deepclusterv2_400ep_pretrain.sh`, `main_deepclusterv2.py` (optimizer, lr "
        "schedule, `cluster_memory`), `src/resnet50.py` (head, `MultiPrototypes`)",
    ),
    rows=(
        Row(
            "optimizer",
            "larc",
            "`main_deepclusterv2.py`: `LARC(SGD, trust_coefficient=0.001, clip=False)`",
        ),
        Row("OPTIMIZER.momentum", 0.9, "`main_deepclusterv2.py`", label="momentum"),
        Row("trust_coefficient", 0.001, "`main_deepclusterv2.py`"),
        Row("lr", Lr(4.8, per=4096), "the script: `--base_lr 4.8` at batch 4096"),
        Row("warmup_epochs", 10, "the script: `--warmup_epochs 10`"),
        Row("warmup_start", 0.3 / 4.8, "the script: `--start_warmup 0.3` (of 4.8)"),
        Row(
            "lr_schedule",
            Sched("cosine", end_rel=0.001),
            "`main_deepclusterv2.py` (`--final_lr 0.0048` of 4.8)",
        ),
        Row("weight_decay", 1e-6, "the script: `--wd 0.000001`"),
        Row("wd_exempt", (), "`main_deepclusterv2.py`: SGD over `model.parameters()`"),
        Row(
            "batch_size",
            4096,
            "the script: 64 per GPU on 64 GPUs",
            ours={"deepclusterv2_8gpu_resnet50": 512},
            why="one node of 8 GPUs at 64 each; the whole lr schedule scales linearly "
            "(peak 0.6, warm-up from 0.0375, end 0.0006).",
        ),
        Row(
            "epochs",
            800,
            "the script: `--epochs 800`",
            ours={"deepclusterv2_8gpu_resnet50": 400},
            why="the length of the authors' `deepclusterv2_400ep_pretrain.sh` (whose crops are "
            "2 x 160 + 4 x 96; ours keep the 800-epoch script's).",
        ),
        Row(
            "LOSS.deepclusterv2_loss.temperature",
            0.1,
            "the script: `--temperature`",
            label="temperature",
        ),
        Row(
            "LOSS.deepclusterv2_loss.num_clusters",
            (3000, 3000, 3000),
            "the script: `--nmb_prototypes 3000 3000 3000`",
            label="clusterings",
        ),
        Row(
            "LOSS.deepclusterv2_loss.kmeans_iters",
            10,
            "`main_deepclusterv2.py` `cluster_memory(nmb_kmeans_iters=10)`",
            label="k-means iterations",
        ),
        Row(
            "LOSS.deepclusterv2_loss.memory_params.crops_for_mb",
            (0, 1),
            "the script: `--crops_for_assign 0 1`",
            label="crops in the memory",
        ),
        Row(
            "crops",
            ((2, 224, (0.14, 1.0)), (6, 96, (0.05, 0.14))),
            "the script: `--nmb_crops 2 6 --size_crops 224 96 --min_scale_crops 0.14 0.05 "
            "--max_scale_crops 1. 0.14`",
        ),
        Row(
            "head",
            "Linear 2048-2048, BN, ReLU, Linear 2048-128, Linear 128-3000 (no bias), "
            "Linear 128-3000 (no bias), Linear 128-3000 (no bias)",
            "`src/resnet50.py` (`projection_head`, `MultiPrototypes`)",
        ),
        Row("zero_init_residual", False, "`src/resnet50.py` (`zero_init_residual=False`)"),
    ),
)

VISSL = "`facebookresearch/vissl` at `09270ed`"

ROTNET = Card(
    method="RotNet",
    page="rotnet",
    title="RotNet (ResNet-50): VISSL's ImageNet recipe, with the paper's four rotations per image",
    configs=("pretrain/rotnet/rotnet_8gpu_resnet50", "pretrain/rotnet/rotnet_64gpu_resnet50"),
    sources=(
        f"{VISSL}: `configs/config/pretrain/rotnet/rotnet_8gpu_resnet.yaml` (the ResNet-50 "
        "recipe of the RotNet authors' colleagues, Goyal et al. 2019)",
        "`gidariss/FeatureLearningRotNet` at `edafaba` (Gidaris et al., ICLR 2018): "
        "`dataloader.py` (every image in all four rotations in one batch); its ImageNet "
        "recipe is an AlexNet one (`config/ImageNet_RotNet_AlexNet.py`)",
    ),
    rows=(
        Row("optimizer", "sgd", "VISSL config"),
        Row("OPTIMIZER.momentum", 0.9, "VISSL config", label="momentum"),
        Row("OPTIMIZER.nesterov", False, "VISSL config", label="Nesterov"),
        Row("lr", Lr(0.1), "VISSL config (`base_value: 0.1` per 256 images, auto-scaled)"),
        Row(
            "warmup_epochs",
            0,
            "VISSL config",
            ours={"rotnet_64gpu_resnet50": 5},
            why="batch 1024 images (4096 rows): Goyal et al.'s gradual warm-up over 5 epochs "
            "from a quarter of the peak, the warm-up VISSL's Jigsaw and ClusterFit configs "
            "write for the same schedule.",
        ),
        Row(
            "warmup_start",
            1.0,
            "VISSL config",
            ours={"rotnet_64gpu_resnet50": 0.25},
            why="the 64-GPU warm-up starts at a quarter of the peak (see the warm-up epochs).",
        ),
        Row(
            "lr_schedule",
            Sched("steps", milestones=(30, 60, 90, 100), gamma=0.1),
            "VISSL config (`multistep` at 30, 60, 90, 100)",
        ),
        Row("weight_decay", 1e-4, "VISSL config"),
        Row("wd_exempt", ("norm",), "VISSL config (`regularize_bn: False`)"),
        Row(
            "batch_size",
            256,
            "VISSL config (32 per GPU on 8 GPUs)",
            ours={"rotnet_64gpu_resnet50": 1024},
            why="16 images per GPU on 64 GPUs, the lr scaled linearly (0.4).",
        ),
        Row("epochs", 105, "VISSL config"),
        Row(
            "DATA.TRAIN.COLLATE_FUNCTION_PARAMS.num_angles",
            4,
            "`FeatureLearningRotNet` `dataloader.py` (the four rotations of every image, "
            "labels 0-3; VISSL's `ImgRotatePil` draws one rotation per image instead)",
            label="rotations of each image in the batch",
        ),
        Row("crops", ((1, 224, (0.08, 1.0)),), "VISSL config (`RandomResizedCrop: 224`)"),
        Row("head", "Linear 2048-4", "VISSL config (`mlp` 2048 -> 4)"),
    ),
)

JIGSAW = Card(
    method="Jigsaw",
    page="jigsaw",
    title="Jigsaw (ResNet-50, 2000 permutations)",
    configs=("pretrain/jigsaw/jigsaw_8gpu_resnet50", "pretrain/jigsaw/jigsaw_64gpu_resnet50"),
    sources=(
        f"{VISSL}: `configs/config/pretrain/jigsaw/jigsaw_8gpu_resnet.yaml` (Goyal et al. "
        "2019's ResNet-50 Jigsaw), `configs/config/pretrain/jigsaw/optimization/"
        "bs32_4nodes.yaml`",
    ),
    rows=(
        Row("optimizer", "sgd", "VISSL config"),
        Row("OPTIMIZER.momentum", 0.9, "VISSL config", label="momentum"),
        Row("OPTIMIZER.nesterov", False, "VISSL config", label="Nesterov"),
        Row("lr", Lr(0.1), "VISSL config (`base_value: 0.1` per 256 images)"),
        Row("warmup_epochs", 5, "VISSL config (`lengths: [0.047619, ...]` of 105 epochs)"),
        Row(
            "warmup_start",
            0.25,
            "VISSL config (linear from 0.025 to 0.1; its "
            "`optimization/bs32_4nodes.yaml`: 0.1 to 0.4)",
            ours={"jigsaw_64gpu_resnet50": 0.125},
            why="VISSL's multi-node warm-up start, 0.1 x (images per node)/256 = 0.1, kept on "
            "8 nodes, where it is 1/8 of the peak 0.8 (on VISSL's own 4 nodes it is 1/4).",
        ),
        Row(
            "lr_schedule",
            Sched("steps", milestones=(30, 60, 90, 100), gamma=0.1),
            "VISSL config (`multistep` at 30, 60, 90, 100)",
        ),
        Row("weight_decay", 1e-4, "VISSL config"),
        Row("wd_exempt", ("norm",), "VISSL config (`regularize_bn: False`)"),
        Row(
            "batch_size",
            256,
            "VISSL config (32 per GPU on 8 GPUs)",
            ours={"jigsaw_64gpu_resnet50": 2048},
            why="32 per GPU on 64 GPUs, the lr scaled linearly (0.8).",
        ),
        Row("epochs", 105, "VISSL config"),
        Row(
            "transforms",
            (
                "Resize",
                "RandomHorizontalFlip",
                "RandomCrop",
                "RandomGrayscale",
                "ToTensor",
                "Normalize",
                "ImgPatchesFromTensor",
                "ShuffleImgPatches",
            ),
            "VISSL config (256 px, flip, 255 px crop, grey p 0.66, 9 patches with jitter 21, "
            "2000 permutations)",
        ),
        Row("DATA.TRAIN.TRANSFORMS.2.size", 255, "VISSL config", label="crop cut into patches"),
        Row("DATA.TRAIN.TRANSFORMS.6.patch_jitter", 21, "VISSL config", label="patch jitter"),
        Row(
            "head",
            "Linear 2048-1000, BN, ReLU → SiameseConcatView → Linear 9000-2000",
            "VISSL config (`mlp` 2048 -> 1000 with BN and ReLU, `siamese_concat_view` of 9, "
            "`mlp` 9000 -> 2000)",
        ),
    ),
    notes=(
        "VISSL's own auto-scaling would drop this warm-up on one node (its warm-up starts at "
        "0.1 x (batch per node)/256 = the peak); the card keeps the schedule the config "
        "writes, as ours runs it. VISSL updates it once per epoch, ours per step.",
    ),
)

COLORIZATION = Card(
    method="Colorization",
    page="colorization",
    title="Colorization (AlexNet): Zhang et al.'s training",
    configs=(
        "pretrain/colorization/colorization_8gpu_alexnet",
        "pretrain/colorization/colorization_64gpu_alexnet",
    ),
    sources=(
        "`richzhang/colorization` (`train/solver.prototxt` at `4aa459f`: Adam, `momentum 0.9`, "
        "`momentum2 0.99`, `weight_decay 0.001`, `base_lr 3e-5`)",
        "the Colorization paper (Zhang, Isola, Efros, ECCV 2016), Sec. 3.1: batch 40, "
        "3e-5 to 200k iterations, 1e-5 to 375k, 3e-6 to 450k; Q = 313 in-gamut bins",
        "VISSL ships no Colorization pretraining config (it converts the Caffe models)",
    ),
    rows=(
        Row("optimizer", "adam", "`train/solver.prototxt` (`type: Adam`)"),
        Row(
            "OPTIMIZER.betas",
            (0.9, 0.99),
            "`train/solver.prototxt` (`momentum`, `momentum2`)",
            label="betas",
        ),
        Row("weight_decay", 1e-3, "`train/solver.prototxt`"),
        Row(
            "lr",
            Lr(3e-5, per=40, rule="none"),
            "`train/solver.prototxt` `base_lr`; paper (batch 40)",
            ours=Lr(3e-5, per=40, rule="sqrt"),
            why="batch 320 (8 GPUs) or 1280 (64 GPUs): Adam's rate scaled by the square root of "
            "the batch ratio (8.49e-5 and 1.70e-4).",
        ),
        Row("warmup_epochs", 0, "paper"),
        Row(
            "lr_schedule",
            Sched("steps", milestones=(6, 12), gamma=1 / 3),
            "paper: /3 at 200k and /10 at 375k of 450k iterations of 40 images (epochs 6.2 "
            "and 11.7 of 14)",
        ),
        Row(
            "batch_size",
            40,
            "paper",
            ours={"colorization_8gpu_alexnet": 320, "colorization_64gpu_alexnet": 1280},
            why="40 images per GPU on 8 GPUs (Zhang et al.'s batch per GPU), 20 per GPU on 64.",
        ),
        Row("epochs", 14, "paper (450k iterations of 40 images)"),
    ),
)

PIRL = Card(
    method="PIRL",
    page="pirl",
    title="PIRL (ResNet-50, jigsaw transform)",
    configs=("pretrain/pirl/pirl_8gpu_resnet50", "pretrain/pirl/pirl_64gpu_resnet50"),
    sources=(
        f"{VISSL}: `configs/config/pretrain/pirl/pirl_jigsaw_4node_resnet50.yaml` (the PIRL "
        "authors' recipe, Misra & van der Maaten, CVPR 2020), `pirl/epochs/epochs_200.yaml`",
    ),
    rows=(
        Row("optimizer", "sgd", "VISSL config"),
        Row("OPTIMIZER.momentum", 0.9, "VISSL config", label="momentum"),
        Row("lr", Lr(0.03), "VISSL config (`base_value: 0.03` per 256; 0.12 at 1024)"),
        Row("warmup_epochs", 0, "VISSL config"),
        Row("lr_schedule", Sched("cosine", end_rel=0.001), "VISSL config (cosine 0.12 to 0.00012)"),
        Row("weight_decay", 1e-4, "VISSL config"),
        Row(
            "wd_exempt", ("bias", "norm"), "VISSL config (`regularize_bn`, `regularize_bias` False)"
        ),
        Row(
            "batch_size",
            1024,
            "VISSL config (32 per GPU on 4 nodes x 8)",
            ours={"pirl_8gpu_resnet50": 256},
            why="32 per GPU on one node of 8 GPUs, the lr scaled linearly (0.03).",
        ),
        Row(
            "epochs",
            800,
            "VISSL config",
            ours={"pirl_8gpu_resnet50": 200},
            why="VISSL's `pirl/epochs/epochs_200.yaml` length for the one-node run.",
        ),
        Row("LOSS.nce_loss_with_memory.temperature", 0.07, "VISSL config", label="temperature"),
        Row(
            "LOSS.nce_loss_with_memory.negative_sampling_params.num_negatives",
            32000,
            "VISSL config",
            label="negatives",
        ),
        Row(
            "LOSS.nce_loss_with_memory.loss_weights",
            (0.5, 0.5),
            "VISSL config",
            label="loss weights (patches, image)",
        ),
        Row(
            "LOSS.nce_loss_with_memory.memory_params.momentum",
            0.5,
            "VISSL config",
            label="memory momentum",
        ),
        Row(
            "transforms",
            (
                "ImgPilToPatchesAndImage",
                "ColorJitter",
                "ImgPilRandomPhotometric",
                "RandomGrayscale",
                "RandomHorizontalFlip",
                "ToTensor",
                "Normalize",
            ),
            "VISSL config",
        ),
        Row(
            "head",
            "Linear 2048-128, SiameseConcatView, Linear 1152-128 | Linear 2048-128",
            "VISSL config (patch head; image head)",
        ),
    ),
)

CLUSTERFIT = Card(
    method="ClusterFit",
    page="clusterfit",
    title="ClusterFit step 2 (ResNet-50 on 16000 clusters)",
    configs=(
        "pretrain/clusterfit/clusterfit_8gpu_resnet50",
        "pretrain/clusterfit/clusterfit_64gpu_resnet50",
    ),
    sources=(
        f"{VISSL}: `configs/config/pretrain/clusterfit/clusterfit_resnet_8gpu_imagenet.yaml` "
        "(step 2) and `cluster_features_resnet_8gpu_imagenet.yaml` (step 1: 16000 clusters)",
    ),
    rows=(
        Row("optimizer", "sgd", "VISSL config"),
        Row("OPTIMIZER.momentum", 0.9, "VISSL config", label="momentum"),
        Row("OPTIMIZER.nesterov", False, "VISSL config", label="Nesterov"),
        Row("lr", Lr(0.1), "VISSL config (`base_value: 0.1` per 256)"),
        Row(
            "warmup_epochs",
            0,
            "VISSL config (its warm-up is dropped by VISSL's auto-scaling on one node)",
            ours={"clusterfit_64gpu_resnet50": 5},
            why="batch 4096: Goyal et al.'s 5-epoch gradual warm-up from a quarter of the "
            "peak, as VISSL's Jigsaw config writes it.",
        ),
        Row(
            "warmup_start",
            1.0,
            "VISSL config",
            ours={"clusterfit_64gpu_resnet50": 0.25},
            why="the 64-GPU warm-up starts at a quarter of the peak.",
        ),
        Row(
            "lr_schedule",
            Sched("steps", milestones=(30, 60, 90, 100), gamma=0.1),
            "VISSL config (`multistep` at 30, 60, 90, 100)",
        ),
        Row("weight_decay", 1e-4, "VISSL config"),
        Row("wd_exempt", ("norm",), "VISSL config (`regularize_bn: False`)"),
        Row(
            "batch_size",
            256,
            "VISSL config",
            ours={"clusterfit_64gpu_resnet50": 4096},
            why="64 per GPU on 64 GPUs, the lr scaled linearly (1.6).",
        ),
        Row("epochs", 105, "VISSL config"),
        Row("crops", ((1, 224, (0.08, 1.0)),), "VISSL config"),
        Row(
            "transform:ColorJitter.hue",
            0.2,
            "VISSL config (`hue: [-0.2, 0.2]`; brightness, contrast, saturation [0.6, 1.4])",
            label="colour jitter hue",
        ),
        Row(
            "transform:ColorJitter.brightness",
            0.4,
            "VISSL config (`[0.6, 1.4]`)",
            label="colour jitter brightness",
        ),
        Row("head", "Linear 2048-16000", "VISSL config"),
    ),
)

NPID = Card(
    method="NPID",
    page="npid",
    title="NPID (ResNet-50, 200 epochs)",
    configs=("pretrain/npid/npid_8gpu_resnet50", "pretrain/npid/npid_64gpu_resnet50"),
    sources=(
        "`zhirongw/lemniscate.pytorch` at `f7cfe29` (the NPID authors' code): `main.py` "
        "(argparse defaults, `adjust_learning_rate`, transforms), `README.md`",
        f"{VISSL}: `configs/config/pretrain/npid/npid_8gpu_resnet.yaml` (VISSL's ResNet-50 "
        "NPID: the same optimisation, BN without weight decay, crops at 0.08-1, no grey)",
    ),
    rows=(
        Row("optimizer", "sgd", "`main.py`"),
        Row("OPTIMIZER.momentum", 0.9, "`main.py` `--momentum`", label="momentum"),
        Row("lr", Lr(0.03), "`main.py` `--lr` (batch 256)"),
        Row("warmup_epochs", 0, "`main.py` `adjust_learning_rate`"),
        Row(
            "lr_schedule",
            Sched("steps", milestones=(120, 160), gamma=0.1),
            "`main.py` `adjust_learning_rate`",
        ),
        Row("weight_decay", 1e-4, "`main.py` `--weight-decay` (VISSL: 1e-4 too)"),
        Row("wd_exempt", (), "`main.py`: SGD over `model.parameters()` (VISSL: none on BN)"),
        Row(
            "batch_size",
            256,
            "`main.py` `-b`",
            ours={"npid_64gpu_resnet50": 1024},
            why="16 per GPU on 64 GPUs, the lr scaled linearly.",
        ),
        Row("epochs", 200, "`main.py` `--epochs`"),
        Row(
            "LOSS.nce_loss_with_memory.temperature",
            0.07,
            "`main.py` `--nce-t`",
            label="temperature",
        ),
        Row(
            "LOSS.nce_loss_with_memory.negative_sampling_params.num_negatives",
            4096,
            "`main.py` `--nce-k`",
            label="negatives",
        ),
        Row(
            "LOSS.nce_loss_with_memory.memory_params.momentum",
            0.5,
            "`main.py` `--nce-m`",
            label="memory momentum",
        ),
        Row(
            "LOSS.nce_loss_with_memory.memory_params.embedding_dim",
            128,
            "`main.py` `--low-dim`",
            label="dim",
        ),
        Row(
            "crops",
            ((1, 224, (0.2, 1.0)),),
            "`main.py` (`RandomResizedCrop(224, scale=(0.2, 1.))`)",
        ),
        Row("head", "Linear 2048-128", "`main.py` (the ResNet's `fc` to `--low-dim`)"),
    ),
)

BYOL_REPO = (
    "`google-deepmind/deepmind-research` at `f5de0ed`: `byol/configs/byol.py` (the 300-epoch "
    "presets: lr 0.3, weight decay 1e-6, EMA 0.99), `byol/main_loop.py` (batch 4096), "
    "`byol/utils/schedules.py`, `byol/utils/networks.py` (`MLP`), `byol/byol_experiment.py` "
    "(LARS and its filters), `byol/utils/dataset.py` (crops); `google-deepmind/dm-haiku` at "
    "`f4d858a` `haiku/_src/nets/resnet.py` (`BlockV1`: the last BN of each block starts at 0)"
)

BYOL = Card(
    method="BYOL",
    page="byol",
    title="BYOL (ResNet-50, 300 epochs)",
    configs=("pretrain/byol/byol_8gpu_resnet50", "pretrain/byol/byol_64gpu_resnet50"),
    sources=(BYOL_REPO,),
    rows=(
        Row("optimizer", "lars", "`byol_experiment.py` `_optimizer`"),
        Row("OPTIMIZER.momentum", 0.9, "`configs/byol.py`", label="momentum"),
        Row("trust_coefficient", 0.001, "`configs/byol.py` (`eta=1e-3`)"),
        Row(
            "trust_ratio_exempt",
            ("bias", "norm"),
            "`byol_experiment.py` (`lars_adaptation_filter=exclude_bias_and_norm`)",
        ),
        Row(
            "wd_exempt",
            ("bias", "norm"),
            "`byol_experiment.py` (`weight_decay_filter=exclude_bias_and_norm`)",
        ),
        Row("lr", Lr(0.3), "`configs/byol.py` `_LR_PRESETS[300]`; `schedules.learning_schedule`"),
        Row("warmup_epochs", 10, "`configs/byol.py` (`warmup_steps`)"),
        Row("warmup_start", 0.0, "`schedules.learning_schedule`"),
        Row("lr_schedule", Sched("cosine", end_rel=0.0), "`schedules.learning_schedule`"),
        Row("weight_decay", 1e-6, "`configs/byol.py` `_WD_PRESETS[300]`"),
        Row(
            "LOSS.byol_loss.momentum",
            0.99,
            "`configs/byol.py` `_EMA_PRESETS[300]` (cosine to 1: `schedules.target_ema`)",
            label="target EMA (start)",
        ),
        Row(
            "batch_size",
            4096,
            "`main_loop.py` `--batch_size`",
            ours={"byol_8gpu_resnet50": 512},
            why="64 per GPU on one node of 8 GPUs, the lr scaled linearly.",
        ),
        Row("epochs", 300, "`configs/byol.py` (the 300-epoch presets)"),
        Row(
            "crops",
            ((2, 224, (0.08, 1.0)),),
            "`utils/dataset.py` (`_decode_and_random_crop`: area 0.08-1)",
        ),
        Row(
            "head",
            "Linear 2048-4096, BN, ReLU, Linear 4096-256 (no bias) → Linear 256-4096, BN, ReLU, "
            "Linear 4096-256 (no bias)",
            "`utils/networks.py` `MLP` (projector, predictor: `hk.Linear(with_bias=False)` last)",
        ),
        Row("zero_init_residual", True, "haiku `BlockV1` (`batchnorm_2`: `scale_init=zeros`)"),
    ),
)

SIMSIAM_REPO = (
    "`facebookresearch/simsiam` at `a7bc177`: `main_simsiam.py` (argparse defaults, "
    "`adjust_learning_rate`, `--fix-pred-lr`, transforms), `simsiam/builder.py` (projector, "
    "predictor, `zero_init_residual`), `README.md` (the command: defaults plus `--fix-pred-lr`)"
)

SIMSIAM = Card(
    method="SimSiam",
    page="simsiam",
    title="SimSiam (ResNet-50, 100 epochs, batch 512)",
    configs=("pretrain/simsiam/simsiam_8gpu_resnet50", "pretrain/simsiam/simsiam_64gpu_resnet50"),
    sources=(SIMSIAM_REPO,),
    rows=(
        Row(
            "optimizer",
            "sgd",
            "`main_simsiam.py`",
            ours={"simsiam_64gpu_resnet50": "lars"},
            why="batch 4096: the SimSiam paper trains its large batches with LARS (Sec. 4.1, "
            "batch size).",
        ),
        Row("OPTIMIZER.momentum", 0.9, "`main_simsiam.py` `--momentum`", label="momentum"),
        Row("lr", Lr(0.05), "`main_simsiam.py` (`init_lr = lr x batch / 256`)"),
        Row("warmup_epochs", 0, "`main_simsiam.py` `adjust_learning_rate`"),
        Row(
            "lr_schedule", Sched("cosine", end_rel=0.0), "`main_simsiam.py` `adjust_learning_rate`"
        ),
        Row(
            "lr_head_schedule",
            Sched("constant"),
            "`--fix-pred-lr` (README): the predictor keeps the initial lr",
            label="predictor lr schedule",
        ),
        Row("weight_decay", 1e-4, "`main_simsiam.py` `--wd`"),
        Row(
            "wd_exempt",
            (),
            "`main_simsiam.py`: SGD over every parameter",
            ours={"simsiam_64gpu_resnet50": ("bias", "norm")},
            why="with LARS at batch 4096, the 1-D parameters get neither weight decay nor the "
            "trust ratio, as in the LARS of SimCLR, BYOL and MoCo v3.",
        ),
        Row(
            "batch_size",
            512,
            "`main_simsiam.py` `-b`",
            ours={"simsiam_64gpu_resnet50": 4096},
            why="64 per GPU on 64 GPUs (the paper's largest batch, with LARS).",
        ),
        Row("epochs", 100, "`main_simsiam.py` `--epochs`"),
        Row(
            "crops",
            ((2, 224, (0.2, 1.0)),),
            "`main_simsiam.py` (`RandomResizedCrop(224, scale=(0.2, 1.))`)",
        ),
        Row(
            "head",
            "Linear 2048-2048 (no bias), BN, ReLU, Linear 2048-2048 (no bias), BN, ReLU, "
            "Linear 2048-2048 (no bias), BN (no affine) → Linear 2048-512 (no bias), BN, ReLU, "
            "Linear 512-2048",
            "`simsiam/builder.py` (the projector's last Linear has its bias frozen: no bias)",
        ),
        Row("zero_init_residual", True, "`simsiam/builder.py` (`zero_init_residual=True`)"),
    ),
)

MOCO_V3_REPO = (
    "`facebookresearch/moco-v3` at `c349e6e`: `main_moco.py` (argparse defaults, lr scaling, "
    "`adjust_learning_rate`, `adjust_moco_momentum`, transforms), `moco/builder.py` "
    "(`_build_mlp`), `moco/optimizer.py` (LARS: 1-D parameters excluded), `vits.py` (fixed "
    "2-D sin-cos position embedding), `CONFIG.md` (the reference commands)"
)


def _moco_v3_resnet_rows() -> tuple[Row, ...]:
    return (
        Row("optimizer", "lars", "`main_moco.py` `--optimizer lars`"),
        Row("OPTIMIZER.momentum", 0.9, "`moco/optimizer.py`", label="momentum"),
        Row("trust_coefficient", 0.001, "`moco/optimizer.py`"),
        Row("trust_ratio_exempt", ("bias", "norm"), "`moco/optimizer.py` (`p.ndim > 1` only)"),
        Row("wd_exempt", ("bias", "norm"), "`moco/optimizer.py` (`p.ndim > 1` only)"),
        Row("lr", Lr(0.6), "`main_moco.py` `--lr` (x batch / 256)"),
        Row("warmup_epochs", 10, "`main_moco.py` `--warmup-epochs`"),
        Row("warmup_start", 0.0, "`main_moco.py` `adjust_learning_rate`"),
        Row("lr_schedule", Sched("cosine", end_rel=0.0), "`main_moco.py` `adjust_learning_rate`"),
        Row("weight_decay", 1e-6, "`main_moco.py` `--wd`"),
        Row(
            "batch_size",
            4096,
            "`main_moco.py` `-b`",
            ours={"moco_v3_8gpu_resnet50": 1024},
            why="128 per GPU on one node of 8 GPUs, the lr scaled linearly (2.4).",
        ),
        Row("epochs", 100, "`CONFIG.md` (ResNet-50, 100-epoch pre-training)"),
        Row("LOSS.moco_v3_loss.temperature", 1.0, "`main_moco.py` `--moco-t`", label="temperature"),
        Row(
            "LOSS.moco_v3_loss.momentum",
            0.99,
            "`main_moco.py` `--moco-m` (`--moco-m-cos`: cosine to 1)",
            label="momentum encoder (start)",
        ),
        Row("crops", ((2, 224, (0.2, 1.0)),), "`CONFIG.md` `--crop-min=.2`"),
        Row(
            "head",
            "Linear 2048-4096 (no bias), BN, ReLU, Linear 4096-256 (no bias), BN (no affine) → "
            "Linear 256-4096 (no bias), BN, ReLU, Linear 4096-256 (no bias)",
            "`moco/builder.py` `MoCo_ResNet` (projector `last_bn=True`, predictor `last_bn=False`)",
        ),
        Row("zero_init_residual", True, "`main_moco.py` (`zero_init_residual=True`)"),
    )


MOCO_V3_RESNET = Card(
    method="MoCo v3, ResNet-50",
    page="moco_v3",
    title="MoCo v3 (ResNet-50, 100 epochs)",
    configs=("pretrain/moco_v3/moco_v3_8gpu_resnet50", "pretrain/moco_v3/moco_v3_64gpu_resnet50"),
    sources=(MOCO_V3_REPO,),
    rows=_moco_v3_resnet_rows(),
)


def _moco_v3_vit_rows(batch: int, command: str) -> tuple[Row, ...]:
    return (
        Row("optimizer", "adamw", f"{command} `--optimizer=adamw`"),
        Row(
            "OPTIMIZER.betas",
            (0.9, 0.999),
            "`main_moco.py` (`torch.optim.AdamW` defaults)",
            label="betas",
        ),
        Row("lr", Lr(1.5e-4), f"{command} `--lr=1.5e-4` (x batch / 256)"),
        Row("warmup_epochs", 40, f"{command} `--warmup-epochs=40`"),
        Row("warmup_start", 0.0, "`main_moco.py` `adjust_learning_rate`"),
        Row("lr_schedule", Sched("cosine", end_rel=0.0), "`main_moco.py` `adjust_learning_rate`"),
        Row("weight_decay", 0.1, f"{command} `--weight-decay=.1`"),
        Row("wd_exempt", (), "`main_moco.py`: AdamW over every parameter"),
        Row(
            "pos_embed",
            "sincos",
            "`vits.py` `build_2d_sincos_position_embedding` (`requires_grad = False`)",
            label="position embedding",
        ),
        Row(
            "MODEL.TRUNK.VISION_TRANSFORMERS.FREEZE_PATCH_EMBED",
            True,
            f"{command} `--stop-grad-conv1`",
            label="patch projection frozen",
        ),
        Row("batch_size", batch, f"{command} `-b`"),
        Row("epochs", 300, f"{command} `--epochs=300`"),
        Row("LOSS.moco_v3_loss.temperature", 0.2, f"{command} `--moco-t=.2`", label="temperature"),
        Row(
            "LOSS.moco_v3_loss.momentum",
            0.99,
            "`main_moco.py` `--moco-m` (`--moco-m-cos`)",
            label="momentum encoder (start)",
        ),
        Row("crops", ((2, 224, (0.08, 1.0)),), "`main_moco.py` `--crop-min` default 0.08"),
        Row(
            "head",
            "Linear 384-4096 (no bias), BN, ReLU, Linear 4096-4096 (no bias), BN, ReLU, "
            "Linear 4096-256 (no bias), BN (no affine) → Linear 256-4096 (no bias), BN, ReLU, "
            "Linear 4096-256 (no bias), BN (no affine)",
            "`moco/builder.py` `MoCo_ViT` (both `last_bn=True`)",
        ),
    )


MOCO_V3_VIT_8 = Card(
    method="MoCo v3, ViT-S/16 on one node",
    page="moco_v3",
    title="MoCo v3 (ViT-S/16, 300 epochs), the authors' 1-node 1024-batch setup",
    configs=("pretrain/moco_v3/moco_v3_8gpu_vits16",),
    sources=(MOCO_V3_REPO,),
    rows=_moco_v3_vit_rows(1024, "`CONFIG.md` (ViT-Small, 1-node):"),
)

MOCO_V3_VIT_64 = Card(
    method="MoCo v3, ViT-S/16",
    page="moco_v3",
    title="MoCo v3 (ViT-S/16, 300 epochs, batch 4096)",
    configs=("pretrain/moco_v3/moco_v3_64gpu_vits16",),
    sources=(MOCO_V3_REPO,),
    rows=_moco_v3_vit_rows(4096, "`CONFIG.md` (ViT-Small, 4-node):"),
)

NNCLR = Card(
    method="NNCLR",
    page="nnclr",
    title="NNCLR (ResNet-50, 1000 epochs)",
    configs=("pretrain/nnclr/nnclr_8gpu_resnet50", "pretrain/nnclr/nnclr_64gpu_resnet50"),
    sources=(
        "the NNCLR paper (Dwibedi et al., ICCV 2021), Sec. 4 and Appendix A (no official "
        "code): LARS, 0.3 x batch/256 with 10 warm-up epochs then cosine, weight decay 1e-6, "
        "batch 4096, 1000 epochs, temperature 0.1, one support set of 98304, BYOL's views",
        "`lightly-ai/lightly` `lightly/models/modules/heads.py` (`NNCLRProjectionHead`, "
        "`NNCLRPredictionHead`, quoting the paper: every Linear followed by BN, every BN but "
        "the last followed by ReLU)",
    ),
    rows=(
        Row("optimizer", "lars", "paper"),
        Row("trust_ratio_exempt", ("bias", "norm"), "paper (BYOL's LARS)"),
        Row("wd_exempt", ("bias", "norm"), "paper (BYOL's LARS)"),
        Row("lr", Lr(0.3), "paper"),
        Row("warmup_epochs", 10, "paper"),
        Row("warmup_start", 0.0, "paper"),
        Row("lr_schedule", Sched("cosine", end_rel=0.0), "paper"),
        Row("weight_decay", 1e-6, "paper"),
        Row(
            "batch_size",
            4096,
            "paper",
            ours={"nnclr_8gpu_resnet50": 512},
            why="64 per GPU on one node of 8 GPUs, the lr scaled linearly (0.6).",
        ),
        Row("epochs", 1000, "paper"),
        Row("LOSS.nnclr_loss.temperature", 0.1, "paper", label="temperature"),
        Row(
            "LOSS.nnclr_loss.queue_size",
            98304,
            "paper (one support set, searched by every query)",
            label="support set",
        ),
        Row("crops", ((2, 224, (0.08, 1.0)),), "paper (BYOL's augmentations)"),
        Row(
            "head",
            "Linear 2048-2048 (any bias), BN, ReLU, Linear 2048-2048 (any bias), BN, ReLU, "
            "Linear 2048-256 (any bias), BN → Linear 256-4096 (any bias), BN, ReLU, "
            "Linear 4096-256 (any bias)",
            "paper / lightly `NNCLRProjectionHead` (hidden 2048, output 256) and "
            "`NNCLRPredictionHead` (hidden 4096); a bias before a BN is immaterial",
        ),
    ),
)

DINO_REPO = (
    "`facebookresearch/dino` at `7c446df`: `main_dino.py` (argparse defaults: the README's "
    "'vanilla' ViT-S/16 run on one node of 8 GPUs, 100 epochs; `get_params_groups`; "
    "`utils.clip_gradients`), `vision_transformer.py` (`DINOHead`), `README.md` ('Boosting DINO "
    "performance': teacher 0.07 warmed up over 30 epochs; the ResNet-50 command)"
)

DINO_VIT = Card(
    method="DINO, ViT-S/16",
    page="dino",
    title="DINO (ViT-S/16, one node of 8 GPUs, 100 epochs)",
    configs=("pretrain/dino/dino_8gpu_vits16", "pretrain/dino/dino_64gpu_vits16"),
    sources=(DINO_REPO,),
    rows=(
        Row("optimizer", "adamw", "`main_dino.py` `--optimizer`"),
        Row(
            "OPTIMIZER.betas",
            (0.9, 0.999),
            "`main_dino.py` (`torch.optim.AdamW` defaults)",
            label="betas",
        ),
        Row("lr", Lr(0.0005), "`main_dino.py` `--lr` (x batch / 256)"),
        Row("warmup_epochs", 10, "`main_dino.py` `--warmup_epochs`"),
        Row("warmup_start", 0.0, "`utils.cosine_scheduler`"),
        Row("lr_schedule", Sched("cosine", end=1e-6), "`main_dino.py` `--min_lr`"),
        Row(
            "weight_decay",
            Sched("cosine", start=0.04, end=0.4),
            "`main_dino.py` `--weight_decay`, `--weight_decay_end`",
        ),
        Row("wd_exempt", ("bias", "norm"), "`utils.get_params_groups` (biases and 1-D parameters)"),
        Row(
            "grad_clip",
            "per_parameter 3",
            "`main_dino.py` `--clip_grad 3.0`, "
            "`utils.clip_gradients` (each parameter's gradient norm)",
        ),
        Row(
            "batch_size",
            512,
            "README (8 GPUs x `--batch_size_per_gpu 64`)",
            ours={"dino_64gpu_vits16": 4096},
            why="64 per GPU on 64 GPUs, the lr scaled linearly (DINO was tuned up to 1024).",
        ),
        Row("epochs", 100, "`main_dino.py` `--epochs`"),
        Row(
            "LOSS.dino_loss.momentum",
            0.996,
            "`main_dino.py` `--momentum_teacher` (cosine to 1)",
            label="teacher momentum (start)",
        ),
        Row(
            "LOSS.dino_loss.student_temp",
            0.1,
            "`main_dino.py` `DINOLoss`",
            label="student temperature",
        ),
        Row(
            "LOSS.dino_loss.teacher_temp_min",
            0.04,
            "`main_dino.py` `--warmup_teacher_temp`",
            label="teacher temperature (start)",
        ),
        Row(
            "LOSS.dino_loss.teacher_temp_max",
            0.04,
            "`main_dino.py` `--teacher_temp`",
            label="teacher temperature",
            ours=0.07,
            why="the README's 'Boosting DINO performance' setting, the paper's ViT-S/16 one: "
            "0.07, warmed up from 0.04 over 30 epochs.",
        ),
        Row(
            "epochs_of:LOSS.dino_loss.teacher_temp_warmup_iters",
            0.0,
            "`main_dino.py` `--warmup_teacher_temp_epochs`",
            label="teacher temperature warm-up (epochs)",
            ours=30.0,
            why="with the teacher temperature of 0.07 (see above).",
        ),
        Row(
            "LOSS.dino_loss.ema_center",
            0.9,
            "`main_dino.py` `DINOLoss` `center_momentum`",
            label="center momentum",
        ),
        Row(
            "epochs_of:MODEL.TEMP_FROZEN_PARAMS_ITER_MAP.0.1",
            1.0,
            "`main_dino.py` `--freeze_last_layer 1`",
            label="last layer frozen (epochs)",
        ),
        Row(
            "MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE",
            0.1,
            "`main_dino.py` `--drop_path_rate`",
            label="drop path",
        ),
        Row(
            "crops",
            ((2, 224, (0.4, 1.0)), (8, 96, (0.05, 0.4))),
            "`main_dino.py` `--global_crops_scale`, `--local_crops_number 8`, "
            "`--local_crops_scale`",
            ours=((2, 224, (0.4, 1.0)), (10, 96, (0.05, 0.4))),
            why="the paper's 10 local crops (DINO paper, Sec. 4 / appendix: 2 x 224 + 10 x 96).",
        ),
        Row(
            "head",
            "Linear 384-2048, GELU, Linear 2048-2048, GELU, Linear 2048-256, "
            "WNLinear 256-65536 (no bias)",
            "`vision_transformer.py` `DINOHead` (`--out_dim 65536`, no BN, "
            "`--norm_last_layer True`)",
        ),
    ),
)

DINO_RESNET = Card(
    method="DINO, ResNet-50",
    page="dino",
    title="DINO (ResNet-50, the README's one-node command)",
    configs=("pretrain/dino/dino_8gpu_resnet50",),
    sources=(DINO_REPO,),
    rows=(
        Row("optimizer", "sgd", "README `--optimizer sgd`"),
        Row("lr", Lr(0.03), "README `--lr 0.03` (x batch / 256)"),
        Row("warmup_epochs", 10, "`main_dino.py` `--warmup_epochs`"),
        Row("lr_schedule", Sched("cosine", end=1e-6), "`main_dino.py` `--min_lr`"),
        Row("weight_decay", 1e-4, "README `--weight_decay 1e-4 --weight_decay_end 1e-4`"),
        Row("grad_clip", "per_parameter 3", "`main_dino.py` `--clip_grad 3.0`"),
        Row("batch_size", 512, "README (8 GPUs x 64)"),
        Row("epochs", 100, "`main_dino.py` `--epochs`"),
        Row(
            "LOSS.dino_loss.teacher_temp_max",
            0.04,
            "`main_dino.py` `--teacher_temp`",
            label="teacher temperature",
        ),
        Row(
            "crops",
            ((2, 224, (0.14, 1.0)), (8, 96, (0.05, 0.14))),
            "README `--global_crops_scale 0.14 1 --local_crops_scale 0.05 0.14`; "
            "`--local_crops_number 8`",
        ),
    ),
)

IBOT_REPO = (
    "`bytedance/ibot` at `da316d8`: `README.md` (the ViT-S/16 command: 2 nodes x 8 GPUs x 64, "
    "800 epochs, `--teacher_temp 0.07 --warmup_teacher_temp_epochs 30 --norm_last_layer false "
    "--shared_head true --out_dim 8192 --local_crops_number 10 --global_crops_scale 0.25 1 "
    "--local_crops_scale 0.05 0.25 --pred_ratio 0 0.3 --pred_ratio_var 0 0.2`), `main_ibot.py` "
    "(argparse defaults), `utils.py` (`clip_gradients`, `get_params_groups`)"
)


def _ibot_rows() -> tuple[Row, ...]:
    return (
        Row("optimizer", "adamw", "`main_ibot.py` `--optimizer`"),
        Row("lr", Lr(0.0005), "`main_ibot.py` `--lr` (x batch / 256)"),
        Row("warmup_epochs", 10, "`main_ibot.py` `--warmup_epochs`"),
        Row("lr_schedule", Sched("cosine", end=1e-6), "`main_ibot.py` `--min_lr`"),
        Row(
            "weight_decay",
            Sched("cosine", start=0.04, end=0.4),
            "`main_ibot.py` `--weight_decay`, `--weight_decay_end`",
        ),
        Row("wd_exempt", ("bias", "norm"), "`utils.get_params_groups`"),
        Row(
            "grad_clip",
            "per_parameter 3",
            "`main_ibot.py` `--clip_grad 3.0`, `utils.clip_gradients`",
        ),
        Row(
            "batch_size",
            1024,
            "README (16 GPUs x 64)",
            ours=512,
            why="64 per GPU on one node of 8 GPUs, the lr scaled linearly.",
        ),
        Row(
            "epochs",
            800,
            "README `--epochs 800`",
            ours=100,
            why="a 100-epoch run for one node (the iBOT paper reports ViT-S/16 at 100 epochs too).",
        ),
        Row(
            "LOSS.ibot_loss.teacher_momentum",
            0.996,
            "`main_ibot.py` `--momentum_teacher`",
            label="teacher momentum (start)",
        ),
        Row(
            "LOSS.ibot_loss.teacher_temp",
            0.07,
            "README `--teacher_temp 0.07`",
            label="teacher temperature",
        ),
        Row(
            "LOSS.ibot_loss.warmup_teacher_temp_epochs",
            30,
            "README `--warmup_teacher_temp_epochs 30`",
            label="teacher temperature warm-up",
        ),
        Row(
            "LOSS.ibot_loss.teacher_patch_temp",
            0.07,
            "`main_ibot.py` `--teacher_patch_temp`",
            label="patch teacher temperature",
        ),
        Row("LOSS.ibot_loss.lambda1", 1.0, "`main_ibot.py` `--lambda1`", label="lambda1"),
        Row("LOSS.ibot_loss.lambda2", 1.0, "`main_ibot.py` `--lambda2`", label="lambda2"),
        Row(
            "MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE",
            0.1,
            "`main_ibot.py` `--drop_path`",
            label="drop path",
        ),
        Row(
            "crops",
            ((2, 224, (0.25, 1.0)), (10, 96, (0.05, 0.25))),
            "README `--local_crops_number 10 --global_crops_scale 0.25 1 --local_crops_scale "
            "0.05 0.25`",
        ),
    )


IBOT = Card(
    method="iBOT",
    page="ibot",
    title="iBOT (ViT-S/16, 800 epochs, batch 1024)",
    configs=("pretrain/ibot/ibot_8gpu_vits16",),
    sources=(IBOT_REPO,),
    rows=_ibot_rows(),
)

DINOV2_REPO = (
    "`facebookresearch/dinov2` at `b8931f7`: `dinov2/configs/ssl_default_config.yaml` and "
    "`dinov2/configs/train/vitl16_short.yaml` (the ImageNet-1k recipe: ViT-L/16, 64 per GPU "
    "on 32 GPUs, 100 'epochs' of 1250 iterations), `dinov2/utils/param_groups.py`, "
    "`dinov2/train/train.py` (clipping per submodule)"
)

DINOV2 = Card(
    method="DINOv2",
    page="dinov2",
    title="DINOv2 (ImageNet-1k, `vitl16_short`)",
    configs=("pretrain/dinov2/dinov2_8gpu_vitb16",),
    sources=(DINOV2_REPO,),
    rows=(
        Row("optimizer", "adamw", "`ssl_default_config.yaml` (`adamw_beta1/2`)"),
        Row("OPTIMIZER.betas", (0.9, 0.999), "`ssl_default_config.yaml`", label="betas"),
        Row(
            "lr",
            Lr(0.004, per=1024, rule="sqrt"),
            "`ssl_default_config.yaml` (`base_lr`, `scaling_rule: sqrt_wrt_1024`)",
        ),
        Row(
            "warmup_epochs",
            20,
            "`ssl_default_config.yaml` `warmup_epochs: 10` (of its 1250-iteration epochs at "
            "batch 2048: 20 passes over ImageNet-1k)",
        ),
        Row("lr_schedule", Sched("cosine", end=1e-6), "`ssl_default_config.yaml` `min_lr`"),
        Row(
            "weight_decay",
            Sched("cosine", start=0.04, end=0.4),
            "`ssl_default_config.yaml` `weight_decay`, `weight_decay_end`",
        ),
        Row(
            "wd_exempt",
            ("bias", "gamma", "norm"),
            "`utils/param_groups.py` (bias, norm, layer-scale gamma)",
        ),
        Row(
            "OPTIMIZER.layer_wise_lr_decay.decay",
            0.9,
            "`ssl_default_config.yaml` `layerwise_decay`",
            label="layer-wise lr decay",
        ),
        Row(
            "grad_clip",
            "per_module 3",
            "`ssl_default_config.yaml` `clip_grad`; "
            "`train/train.py` (backbone, DINO head, iBOT head clipped apart)",
        ),
        Row(
            "LOSS.dinov2_loss.momentum_teacher",
            0.992,
            "`ssl_default_config.yaml`",
            label="teacher momentum (start)",
        ),
        Row(
            "LOSS.dinov2_loss.teacher_temp",
            0.07,
            "`ssl_default_config.yaml`",
            label="teacher temperature",
        ),
        Row(
            "LOSS.dinov2_loss.koleo_loss_weight",
            0.1,
            "`ssl_default_config.yaml`",
            label="KoLeo weight",
        ),
        Row(
            "LOSS.dinov2_loss.centering",
            "centering",
            "`ssl_default_config.yaml`",
            label="centering",
        ),
        Row(
            "crops",
            ((2, 224, (0.32, 1.0)), (8, 96, (0.05, 0.32))),
            "`ssl_default_config.yaml` `crops`",
        ),
        Row(
            "batch_size",
            2048,
            "`vitl16_short.yaml` (64 per GPU) on the README's 4 nodes of 8 GPUs",
            ours=512,
            why="64 per GPU on one node of 8 GPUs, the lr scaled by the "
            "square root of the batch, DINOv2's rule.",
        ),
        Row(
            "epochs",
            200,
            "`ssl_default_config.yaml` (100 'epochs' of `OFFICIAL_EPOCH_LENGTH: "
            "1250` iterations at batch 2048 = 200 passes over ImageNet-1k)",
        ),
    ),
)

MAE_REPO = (
    "`facebookresearch/mae` at `efb2a80`: `PRETRAIN.md` (the command: 64 per GPU on 64 GPUs, "
    "`--norm_pix_loss --mask_ratio 0.75 --epochs 800 --warmup_epochs 40 --blr 1.5e-4 "
    "--weight_decay 0.05`; ViT-B: `--model mae_vit_base_patch16`), `main_pretrain.py` "
    "(AdamW betas, `add_weight_decay`, transforms), `util/lr_sched.py`, `models_mae.py`"
)


def _mae_rows() -> tuple[Row, ...]:
    return (
        Row("optimizer", "adamw", "`main_pretrain.py`"),
        Row("OPTIMIZER.betas", (0.9, 0.95), "`main_pretrain.py`", label="betas"),
        Row("lr", Lr(1.5e-4), "`PRETRAIN.md` `--blr 1.5e-4` (x batch / 256)"),
        Row("warmup_epochs", 40, "`PRETRAIN.md` `--warmup_epochs 40`"),
        Row("warmup_start", 0.0, "`util/lr_sched.py`"),
        Row("lr_schedule", Sched("cosine", end=0.0), "`util/lr_sched.py` (`--min_lr 0`)"),
        Row("weight_decay", 0.05, "`PRETRAIN.md`"),
        Row(
            "wd_exempt",
            ("bias", "norm"),
            "`main_pretrain.py` (timm `add_weight_decay`: biases and 1-D parameters)",
        ),
        Row(
            "pos_embed",
            "sincos",
            "`models_mae.py` (fixed 2-D sin-cos, `requires_grad=False`)",
            label="position embedding",
        ),
        Row("grad_clip", "none", "`main_pretrain.py`"),
        Row("batch_size", 4096, "`PRETRAIN.md` (64 x 8 nodes x 8 GPUs)"),
        Row("epochs", 800, "`PRETRAIN.md` `--epochs 800`"),
        Row(
            "transform:RandomPatchMasking.mask_ratio",
            0.75,
            "`PRETRAIN.md` `--mask_ratio`",
            label="mask ratio",
        ),
        Row(
            "LOSS.mae_loss.norm_pix_loss",
            True,
            "`PRETRAIN.md` `--norm_pix_loss`",
            label="normalised pixels",
        ),
        Row(
            "crops",
            ((1, 224, (0.2, 1.0)),),
            "`main_pretrain.py` (`RandomResizedCrop(224, scale=(0.2, 1.0))`)",
        ),
        Row(
            "MODEL.HEAD.PARAMS.0.1.decoder_dim",
            512,
            "`models_mae.py` (`decoder_embed_dim`)",
            label="decoder width",
        ),
        Row("MODEL.HEAD.PARAMS.0.1.decoder_depth", 8, "`models_mae.py`", label="decoder depth"),
        Row(
            "MODEL.HEAD.PARAMS.0.1.decoder_num_heads", 16, "`models_mae.py`", label="decoder heads"
        ),
    )


MAE = Card(
    method="MAE",
    page="mae",
    title="MAE (ViT-B/16, 800 epochs)",
    configs=("pretrain/mae/mae_8gpu_vitb16",),
    sources=(MAE_REPO,),
    rows=_mae_rows(),
)

IJEPA_REPO = (
    "`facebookresearch/ijepa` at `52c1ae9`: `configs/in1k_vith14_ep300.yaml` (the only "
    "ImageNet-1k config: ViT-H/14, 16 GPUs x 128, 300 epochs), `src/train.py`, "
    "`src/helper.py` (`init_opt`), `src/models/vision_transformer.py`"
)

IJEPA = Card(
    method="I-JEPA",
    page="ijepa",
    title="I-JEPA (`in1k_vith14_ep300`)",
    configs=("pretrain/ijepa/ijepa_8gpu_vitb16",),
    sources=(IJEPA_REPO,),
    rows=(
        Row("optimizer", "adamw", "`src/helper.py` `init_opt`"),
        Row("lr", Lr(0.001, per=2048, rule="none"), "the config `optimization.lr` (not scaled)"),
        Row(
            "warmup_epochs",
            40,
            "the config `optimization.warmup`",
            ours=15,
            why="the paper's ViT-B/16 schedule (its appendix A: the learning rate rises "
            "from 1e-4 to 1e-3 over the first 15 epochs); the card's 40 epochs from 2e-4 "
            "are the ViT-H/14 config's.",
        ),
        Row(
            "warmup_start",
            0.2,
            "the config `start_lr: 0.0002` (of 0.001)",
            ours=0.1,
            why="the paper's ViT-B/16 warm-up starts at 1e-4 (appendix A).",
        ),
        Row("lr_schedule", Sched("cosine", end=1e-6), "the config `final_lr`"),
        Row(
            "weight_decay",
            Sched("cosine", start=0.04, end=0.4),
            "the config `weight_decay`, `final_weight_decay`",
        ),
        Row("wd_exempt", ("bias", "norm"), "`src/helper.py` `init_opt` (biases and 1-D)"),
        Row(
            "pos_embed",
            "sincos",
            "`src/models/vision_transformer.py` (fixed sin-cos)",
            label="position embedding",
        ),
        Row("grad_clip", "none", "`src/train.py`"),
        Row("batch_size", 2048, "the config (`batch_size: 128` on 16 GPUs)"),
        Row(
            "epochs",
            300,
            "the config `optimization.epochs`",
            ours=600,
            why="the paper trains its ViT-B/16 for 600 epochs (appendix A); 300 is the "
            "ViT-H/14 config's.",
        ),
        Row(
            "LOSS.ijepa_loss.momentum",
            0.996,
            "the config `ema: [0.996, 1.0]` (linear)",
            label="target EMA (start)",
        ),
        Row("crops", ((1, 224, (0.3, 1.0)),), "the config `crop_scale`"),
        Row(
            "MODEL.HEAD.PARAMS.0.1.predictor_dim",
            384,
            "the config `pred_emb_dim`",
            label="predictor width",
        ),
        Row(
            "MODEL.HEAD.PARAMS.0.1.depth",
            12,
            "the config `pred_depth`",
            label="predictor depth",
            ours=6,
            why="our choice for the smaller ViT-B/16 encoder (12 is the ViT-H/14 config's); "
            "not measured against 12 at ImageNet scale.",
        ),
    ),
    notes=(
        "The authors' code ships ImageNet-1k configs for ViT-H only; the card is its "
        "`in1k_vith14_ep300.yaml`. Our ViT-B/16 config follows the paper's appendix A for "
        "its ViT-B/16 schedule (600 epochs, a 15-epoch warm-up from 1e-4), recorded below "
        "as differences from that ViT-H/14 config.",
    ),
)

MSN_REPO = (
    "`facebookresearch/msn` at `4388dc1`: `configs/pretrain/msn_vits16.yaml` (64 per GPU; "
    "the README runs it on 16 GPUs), `src/msn_train.py` (`init_opt`, schedules, clipping), "
    "`src/data_manager.py` (crop scales)"
)

MSN = Card(
    method="MSN",
    page="msn",
    title="MSN (ViT-S/16, `msn_vits16`)",
    configs=("pretrain/msn/msn_8gpu_vits16",),
    sources=(MSN_REPO,),
    rows=(
        Row("optimizer", "adamw", "`src/msn_train.py` `init_opt`"),
        Row("lr", Lr(0.001, per=1024, rule="none"), "the config `lr` (not scaled)"),
        Row("warmup_epochs", 15, "the config `warmup`"),
        Row("warmup_start", 0.2, "the config `start_lr: 0.0002` (of 0.001)"),
        Row(
            "weight_decay",
            Sched("cosine", start=0.04, end=0.4),
            "the config `weight_decay`, `final_weight_decay`",
        ),
        Row(
            "wd_exempt",
            ("bias", "norm", "prototypes"),
            "`init_opt` (bias, bn and 1-D parameters; the prototypes)",
        ),
        Row(
            "grad_clip",
            "global 3 excluding prototypes",
            "the config `clip_grad: 3.0`; `msn_train.py` clips "
            "`encoder.parameters()` (not the prototypes)",
        ),
        Row(
            "batch_size",
            1024,
            "the config (64 per GPU) on the README's 16 GPUs",
            ours=512,
            why="64 per GPU on one node of 8 GPUs (the lr is not scaled, as in MSN).",
        ),
        Row("epochs", 800, "the config `epochs`"),
        Row("LOSS.msn_loss.temperature", 0.1, "the config `temperature`", label="temperature"),
        Row(
            "LOSS.msn_loss.target_temperature",
            0.025,
            "the config `start_sharpen: 0.25` x 0.1",
            label="target temperature",
        ),
        Row("LOSS.msn_loss.me_max_weight", 1.0, "the config `memax_weight`", label="me-max weight"),
        Row("LOSS.msn_loss.use_sinkhorn", True, "the config `use_sinkhorn`", label="Sinkhorn"),
        Row(
            "LOSS.msn_loss.momentum",
            0.996,
            "`msn_train.py` (`_start_m`)",
            label="target momentum (start)",
        ),
        Row(
            "MODEL.HEAD.PARAMS.0.1.num_prototypes",
            1024,
            "the config `num_proto`",
            label="prototypes",
        ),
        Row(
            "crops",
            ((2, 224, (0.3, 1.0)), (10, 96, (0.05, 0.3))),
            "the config (`rand_views: 1` + the target view, `focal_views: 10`); "
            "`data_manager.py` (`rand_crop_scale`, `focal_crop_scale`)",
        ),
    ),
    notes=(
        "Not in the table (documented in the config's header): MSN's lr cosine and its "
        "momentum schedule run over 1.25 x the run (`msn_train.py`), so MSN ends at lr ~2e-4 "
        "and momentum 0.9992; ours end at 1e-6 and 1 at the last step.",
    ),
)


CARDS: tuple[Card, ...] = (
    SIMCLR,
    SIMCLR_MULTICROP,
    MOCO_V2,
    SWAV,
    BARLOW_TWINS,
    VICREG_100,
    VICREG_1000,
    DEEPCLUSTER_V2,
    ROTNET,
    JIGSAW,
    COLORIZATION,
    PIRL,
    CLUSTERFIT,
    NPID,
    BYOL,
    SIMSIAM,
    MOCO_V3_RESNET,
    MOCO_V3_VIT_8,
    MOCO_V3_VIT_64,
    NNCLR,
    DINO_VIT,
    DINO_RESNET,
    IBOT,
    DINOV2,
    MAE,
    IJEPA,
    MSN,
)

if __name__ == "__main__":
    for path in write_pages():
        print(f"wrote {path.relative_to(REPO)}")
