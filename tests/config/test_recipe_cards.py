"""Every recipe card field equals our configs as composed (issue #35, item 4).

The cards (``tests/config/recipe_cards.py``) hold the authors' published ImageNet settings
of every method, each with the file it was read from. Each (card, config) is one test (so
``-n 2`` composes every config once): the config is composed and each field read as the
trainer would see it (``tests/config/_recipe_probes.py``: the lr schedule as built, at the config's
global batch; the heads as built, without the trunk). A failure names the method, the
config, the field, ours, theirs and the source. A deliberate difference is a row with
``ours`` (and ``why``); the method's docs page must show it, in the "Recipe card" section
generated from the card (``PYTHONPATH=. python tests/config/recipe_cards.py`` rewrites it).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.config import _recipe_probes as probes
from tests.config.recipe_cards import (
    CARDS,
    METHODS_DOCS,
    SAME,
    SIMCLR,
    Card,
    Lr,
    Row,
    Sched,
    page_section,
    render_page_section,
    show,
)

CASES = [
    pytest.param(card, config, id=f"{card.method}-{config.rsplit('/', 1)[-1]}")
    for card in CARDS
    for config in card.configs
]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def matches(expected: Any, ours: Any, recipe: probes.Recipe) -> bool:
    """Whether our value ``ours`` is the card's ``expected`` (an Lr at our global batch)."""
    if isinstance(expected, Lr):  # configs write the scaled rates rounded: 0.1 %
        want = expected.at(recipe.global_batch)
        return isinstance(ours, float) and math.isclose(ours, want, rel_tol=1e-3)
    if isinstance(expected, Sched):
        return _sched_matches(expected, ours)
    if isinstance(expected, str) and isinstance(ours, str):
        if "(any bias)" in expected:  # the authors leave the bias open (NNCLR's paper)
            expected, ours = expected.replace(" (any bias)", ""), ours.replace(" (no bias)", "")
        return _norm(expected) == _norm(ours)
    if isinstance(expected, bool) or isinstance(ours, bool):
        return expected is ours
    if isinstance(expected, (int, float)) and isinstance(ours, (int, float)):
        return _close(float(expected), float(ours))
    if isinstance(expected, (tuple, list)) and isinstance(ours, (tuple, list)):
        return len(expected) == len(ours) and all(
            matches(e, o, recipe) for e, o in zip(expected, ours, strict=True)
        )
    return bool(expected == ours)


def _norm(text: str) -> str:
    """Head layouts: ``→`` (our module boundary) reads as ``,``."""
    return " ".join(text.replace("→", ",").replace(" ,", ",").split())


def _sched_matches(expected: Sched, ours: Any) -> bool:
    if not isinstance(ours, Sched) or ours.shape != expected.shape:
        return False
    for name in ("start", "end", "gamma"):
        want = getattr(expected, name)
        if want is not None and not math.isclose(
            want, getattr(ours, name), rel_tol=1e-3, abs_tol=1e-12
        ):
            return False
    if expected.milestones is not None and expected.milestones != ours.milestones:
        return False
    if expected.end_rel is not None:
        assert ours.start is not None and ours.end is not None
        if not math.isclose(ours.end / ours.start, expected.end_rel, rel_tol=1e-3, abs_tol=1e-9):
            return False
    return True


def _describe_ours(ours: Any, expected: Any, recipe: probes.Recipe) -> str:
    if isinstance(expected, Lr) and isinstance(ours, float):
        per = ours * expected.per / recipe.global_batch
        return f"{ours:g} at batch {recipe.global_batch} (= {per:g} per {expected.per} linear)"
    if isinstance(expected, Sched) and isinstance(ours, Sched) and expected.end_rel is not None:
        rel = ours.end / ours.start if ours.start and ours.end is not None else float("nan")
        return f"{show(ours)} (end = {rel:g} x start)"
    return show(ours) if not isinstance(ours, str) else ours


def mismatch(card: Card, config: str, row: Row, recipe: probes.Recipe) -> str | None:
    """``None`` when our config holds the row's value, else what differs and where from."""
    ours = probes.read(recipe, row.field)
    expected = row.expected(config)
    if matches(expected, ours, recipe):
        return None
    if row.differs_in(config):
        want = f"the recorded deliberate difference {show(expected)} (theirs {show(row.theirs)})"
    else:
        want = f"theirs {show(row.theirs)}"
    if isinstance(expected, Lr):
        want += f" = {expected.at(recipe.global_batch):g} at batch {recipe.global_batch}"
    return (
        f"{card.method} {config}: {row.name} ({row.field}): ours "
        f"{_describe_ours(ours, expected, recipe)}, {want}; source: {row.source}"
    )


@pytest.mark.parametrize(("card", "config"), CASES)
def test_card_equals_config(card: Card, config: str) -> None:
    """Every field of the card, checked against ``config`` composed once (one line per
    field that differs: method, config, field, ours, theirs, source)."""
    recipe = probes.recipe(config)
    failures = [m for row in card.rows if (m := mismatch(card, config, row, recipe))]
    if failures:
        pytest.fail(
            f"{len(failures)} of {len(card.rows)} fields differ:\n" + "\n".join(failures),
            pytrace=False,
        )


def test_simclr_batch_group_file_keeps_the_card() -> None:
    """SimCLR writes its lr out (auto-scaling would drop its warm-up on one node), so the
    group file that changes the batch to 4096 must bring SimCLR's lr at 4096 with it."""
    recipe = probes.recipe(
        "pretrain/simclr/simclr_8gpu_resnet", ("+config/pretrain/simclr/optimization=bs32_16nodes",)
    )
    assert recipe.global_batch == 4096
    failures = [
        m
        for row in SIMCLR.rows
        if row.field in ("lr", "warmup_epochs", "warmup_start", "lr_schedule", "batch_size")
        and (m := mismatch(SIMCLR, "pretrain/simclr/simclr_8gpu_resnet+bs32_16nodes", row, recipe))
    ]
    assert not failures, "\n".join(failures)


def test_deliberate_differences_differ_and_say_why() -> None:
    for card in CARDS:
        for row in card.rows:
            if row.ours is SAME:
                continue
            assert row.why, f"{card.method} {row.name}: a difference needs its reason"
            values = row.ours.values() if isinstance(row.ours, dict) else [row.ours]
            for value in values:
                assert value != row.theirs, f"{card.method} {row.name}: 'ours' equals theirs"
            if isinstance(row.ours, dict):
                shorts = {c.rsplit("/", 1)[-1] for c in card.configs}
                assert set(row.ours) <= shorts, (card.method, row.name, set(row.ours) - shorts)


def test_every_method_page_has_a_card() -> None:
    pages = {p.stem for p in METHODS_DOCS.glob("*.md")} - {"index"}  # the method index
    assert pages == {c.page for c in CARDS}


@pytest.mark.parametrize("page", sorted({c.page for c in CARDS}))
def test_page_shows_its_recipe_card(page: str) -> None:
    """The page ends with the section generated from its card(s), differences included."""
    text = (METHODS_DOCS / f"{page}.md").read_text(encoding="utf-8")
    section = page_section(text)
    assert section is not None, (
        f"docs/methods/{page}.md has no '## Recipe card' section: run "
        "PYTHONPATH=. python tests/config/recipe_cards.py"
    )
    for card in CARDS:
        if card.page != page:
            continue
        for row in card.rows:
            if row.ours is not SAME:
                assert row.why in section, (page, card.method, row.name)
    assert section == render_page_section(page), (
        f"docs/methods/{page}.md: the Recipe card section is not the one its card renders; "
        "run PYTHONPATH=. python tests/config/recipe_cards.py"
    )
