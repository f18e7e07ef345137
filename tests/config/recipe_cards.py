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
  scale)), ...)``), ``grad_clip`` (``none`` or ``<mode> <max norm>``), ``zero_init_residual``;
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
        Row("lr", Lr(0.03), "`README.md` (`--lr 0.03 --batch-size 256`; linear scaling for "
            "other batch sizes)"),
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
        Row("optimizer", "larc", "`main_swav.py`: `LARC(SGD, trust_coefficient=0.001, "
            "clip=False)`"),
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
        Row("warmup_start", 0.3 / 4.8, "the script: `--start_warmup 0.3` (of 4.8)",
            ours={"swav_8gpu_resnet": 1.0},
            why="no warm-up at batch 512 (see the warm-up epochs)."),
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
        Row("LOSS.swav_loss.num_iters", 3, "the script: `--sinkhorn_iterations`",
            label="Sinkhorn iterations"),
        Row("LOSS.swav_loss.crops_for_assign", (0, 1), "the script: `--crops_for_assign`",
            label="crops for assignment"),
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
            "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP",
            (("module.heads.0.prototypes0.weight", 313),),
            "the script: `--freeze_prototypes_niters 313` (one epoch at 4096)",
            label="prototypes frozen (iterations)",
            ours={"swav_8gpu_resnet": (("module.heads.0.prototypes0.weight", 2503),)},
            why="one epoch at batch 512, as 313 is one epoch at 4096 (the batch-256 script "
            "freezes 5005, one epoch at 256).",
        ),
        Row("zero_init_residual", False, "`main_swav.py` / `src/resnet50.py` "
            "(`zero_init_residual=False`)"),
    ),
)

CARDS: tuple[Card, ...] = (SIMCLR, SIMCLR_MULTICROP, MOCO_V2, SWAV)

if __name__ == "__main__":
    for path in write_pages():
        print(f"wrote {path.relative_to(REPO)}")
