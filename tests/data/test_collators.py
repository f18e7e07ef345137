"""Collators: default_collate, simclr_collator and multicrop_collator layouts."""

from __future__ import annotations

import pytest
import torch

from vissl.data import build_collate_fn, get_collator
from vissl.errors import ConfigError, UnknownNameError


def _batch(num_samples: int, num_views: int, sizes: list[int] | None = None) -> list[dict]:
    sizes = sizes or [4] * num_views
    batch = []
    for i in range(num_samples):
        batch.append(
            {
                # pixel value encodes (sample, view) so the layout can be checked
                "data": [torch.full((3, s, s), 10.0 * i + v) for v, s in enumerate(sizes)],
                "label": [100 + i] * num_views,
                "data_valid": [1] * num_views,
                "data_idx": [i] * num_views,
            }
        )
    return batch


def test_default_collate_layout():
    batch = _batch(3, 1)
    out = get_collator("default_collate")(batch)
    assert set(out) == {"data", "label", "data_valid", "data_idx"}
    assert len(out["data"]) == 1 and out["data"][0].shape == (3, 3, 4, 4)
    assert out["label"][0].tolist() == [100, 101, 102]
    assert out["label"][0].dtype == torch.int64
    assert out["data_valid"][0].tolist() == [1, 1, 1]
    assert out["data_idx"][0].tolist() == [0, 1, 2]


def test_default_collate_two_sources_gives_one_tensor_per_source():
    out = get_collator("default_collate")(_batch(2, 2))
    assert len(out["data"]) == 2 and out["data"][1].shape == (2, 3, 4, 4)
    assert [t.tolist() for t in out["label"]] == [[100, 101], [100, 101]]


def test_simclr_collator_is_view_major():
    out = get_collator("simclr_collator")(_batch(3, 2))
    assert set(out) == {"data", "label", "data_valid", "data_idx"}
    (data,) = out["data"]
    assert data.shape == (6, 3, 4, 4)
    # row v * B + i is view v of sample i
    assert data[:, 0, 0, 0].tolist() == [0.0, 10.0, 20.0, 1.0, 11.0, 21.0]
    assert out["label"][0].tolist() == [100, 101, 102, 100, 101, 102]
    assert out["data_idx"][0].tolist() == [0, 1, 2, 0, 1, 2]
    assert out["data_valid"][0].tolist() == [1] * 6


def test_multicrop_collator_one_tensor_per_crop():
    out = get_collator("multicrop_collator")(_batch(2, 5, sizes=[8, 8, 4, 4, 4]))
    assert len(out["data"]) == 1
    crops = out["data"][0]
    assert [tuple(c.shape) for c in crops] == [(2, 3, 8, 8)] * 2 + [(2, 3, 4, 4)] * 3
    assert crops[2][:, 0, 0, 0].tolist() == [2.0, 12.0]
    assert out["label"][0].tolist() == [100, 101] * 5
    assert out["data_idx"][0].tolist() == [0, 1] * 5


def test_collator_rejects_misaligned_samples():
    batch = _batch(2, 2)
    batch[1]["label"] = [1]
    with pytest.raises(ConfigError, match="same number of views"):
        get_collator("simclr_collator")(batch)


def test_collate_fn_from_config(cfg_factory):
    cfg = cfg_factory(
        train={
            "COLLATE_FUNCTION": "multicrop_collator",
            "COLLATE_FUNCTION_PARAMS": {"create_multidimensional_tensor": False},
        }
    )
    fn = build_collate_fn(cfg, "TRAIN")
    assert len(fn(_batch(2, 2))["data"][0]) == 2
    bad = cfg_factory(
        train={"COLLATE_FUNCTION": "simclr_collator", "COLLATE_FUNCTION_PARAMS": {"x": 1}}
    )
    with pytest.raises(ConfigError) as info:
        build_collate_fn(bad, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS"
    with pytest.raises(UnknownNameError, match="simclr_collator"):
        build_collate_fn(cfg_factory(train={"COLLATE_FUNCTION": "simclr"}), "TRAIN")


def test_pil_images_get_a_to_tensor_hint():
    from PIL import Image

    batch = _batch(2, 2)
    for sample in batch:
        sample["data"] = [Image.new("RGB", (2, 2))] * 2
    for name in ("default_collate", "simclr_collator", "multicrop_collator"):
        with pytest.raises(ConfigError, match="ToTensor"):
            get_collator(name)(batch)


def test_moco_collator_puts_queries_in_data_and_keys_in_data_momentum():
    out = get_collator("moco_collator")(_batch(3, 2))
    assert set(out) == {"data", "data_momentum", "label", "data_valid", "data_idx"}
    queries, keys = out["data"][0], out["data_momentum"][0]
    assert queries.shape == keys.shape == (3, 3, 4, 4)
    assert queries[:, 0, 0, 0].tolist() == [0.0, 10.0, 20.0]  # view 0 of samples 0..2
    assert keys[:, 0, 0, 0].tolist() == [1.0, 11.0, 21.0]  # view 1
    assert out["label"][0].tolist() == [100, 101, 102]
    assert out["data_idx"][0].tolist() == [0, 1, 2]


def test_moco_collator_needs_two_views():
    with pytest.raises(ConfigError, match="2 views"):
        get_collator("moco_collator")(_batch(2, 3))
