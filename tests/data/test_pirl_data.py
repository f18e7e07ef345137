"""PIRL's data pieces: ``ImgPilToPatchesAndImage`` (an image crop plus the jigsaw patches
of another crop) and ``patch_and_image_collator`` (the ``images`` and ``patches`` inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vissl.data.collators.patch_and_image_collator import patch_and_image_collator
from vissl.data.ssl_transforms.img_pil_to_patches_and_image import ImgPilToPatchesAndImage
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.errors import ConfigError

SIZE = 24


def _position_image() -> Image.Image:
    """Red = column, green = row: every pixel tells where it came from."""
    cols, rows = np.meshgrid(np.arange(SIZE), np.arange(SIZE))
    array = np.stack([cols, rows, np.zeros_like(cols)], axis=2).astype(np.uint8)
    return Image.fromarray(array)


def _whole_image_patches(permute: bool = True) -> list:
    chain = build_transforms(
        [
            {
                "name": "ImgPilToPatchesAndImage",
                "crop_scale_image": [0.3, 1.0],
                "crop_size_image": 10,
                "crop_scale_patches": [1.0, 1.0],  # the whole 24 px image, not resized
                "crop_size_patches": SIZE,
                "num_patches": 9,
                "patch_jitter": 3,
                "permute_patches": permute,
            }
        ],
        tensor_path=False,
    )
    sample = {"data": [_position_image()], "label": [5], "data_valid": [1], "data_idx": [5]}
    return chain(sample)


def _cell(patch: Image.Image) -> tuple[int, int]:
    """The grid cell (column, row) a patch was cut from, checking it is one block of it."""
    array = np.asarray(patch).astype(int)
    cols, rows = array[..., 0], array[..., 1]
    assert array.shape[:2] == (5, 5)  # 8 px cells less the jitter of 3
    assert (np.diff(cols, axis=1) == 1).all() and (np.diff(rows, axis=0) == 1).all()
    col, row = int(cols[0, 0]) // 8, int(rows[0, 0]) // 8
    assert int(cols[0, -1]) // 8 == col and int(rows[-1, 0]) // 8 == row  # inside one cell
    return col, row


def test_the_image_comes_first_then_one_patch_of_every_grid_cell() -> None:
    orders = set()
    for seed in range(6):
        with seeded_rng(seed):
            out = _whole_image_patches()
        data = out["data"]
        assert len(data) == 10 and data[0].size == (10, 10)
        assert out["label"] == [5] * 10 and out["data_idx"] == [5] * 10  # repeated per entry
        cells = [_cell(p) for p in data[1:]]
        assert sorted(cells) == [(c, r) for c in range(3) for r in range(3)]
        orders.add(tuple(cells))
    assert len(orders) > 1  # the patches come in random orders


def test_without_permutation_the_patches_are_in_column_major_order() -> None:
    with seeded_rng(0):
        out = _whole_image_patches(permute=False)
    assert [_cell(p) for p in out["data"][1:]] == [(c, r) for c in range(3) for r in range(3)]


def test_the_same_seed_draws_the_same_crops_and_order() -> None:
    with seeded_rng(3):
        a = _whole_image_patches()["data"]
    with seeded_rng(3):
        b = _whole_image_patches()["data"]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def test_gray_images_give_gray_patches() -> None:
    t = ImgPilToPatchesAndImage(crop_size_image=8, crop_size_patches=12, patch_jitter=1)
    out = t(Image.new("L", (16, 16), color=7))
    assert [im.mode for im in out] == ["L"] * 10
    assert out[1].size == (3, 3)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num_patches": 8}, "num_patches"),
        ({"crop_size_patches": 30, "patch_jitter": 10}, "patch_jitter"),
        ({"crop_scale_image": [0.5]}, "crop_scale_image"),
        ({"crop_scale_patches": [0.9, 0.5]}, "crop_scale_patches"),
        ({"crop_size_image": 0}, "crop_size_image"),
        ({"size": 3}, "size"),
    ],
)
def test_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    entry = {"name": "ImgPilToPatchesAndImage", **kwargs}
    with pytest.raises(ConfigError) as err:
        build_transforms([entry], tensor_path=False)
    assert err.value.key_path == f"config.DATA.TRAIN.TRANSFORMS[0].{key}"


def _samples(batch: int, patches: int = 9) -> list[dict]:
    out = []
    for i in range(batch):
        data = [torch.full((3, 6, 6), float(i))]
        data += [torch.full((3, 4, 4), float(10 * i + k)) for k in range(patches)]
        n = len(data)
        out.append(
            {"data": data, "label": [i + 100] * n, "data_valid": [1] * n, "data_idx": [i] * n}
        )
    return out


def test_the_collator_makes_images_and_sample_major_patches() -> None:
    batch = patch_and_image_collator(_samples(3))
    assert set(batch) == {"images", "patches", "label", "data_valid", "data_idx"}
    images, patches = batch["images"][0], batch["patches"][0]
    assert images.shape == (3, 3, 6, 6) and patches.shape == (27, 3, 4, 4)
    assert images[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]
    # rows i*9 .. i*9+8 are sample i's patches, in their order
    assert patches[:, 0, 0, 0].tolist() == [10.0 * i + k for i in range(3) for k in range(9)]
    assert batch["label"][0].tolist() == [100, 101, 102]
    assert batch["data_idx"][0].tolist() == [0, 1, 2]
    from vissl.data.collators import get_collator

    assert get_collator("patch_and_image_collator") is patch_and_image_collator


def test_the_collator_explains_a_sample_without_patches() -> None:
    with pytest.raises(ConfigError, match="ImgPilToPatchesAndImage"):
        patch_and_image_collator(_samples(2, patches=0))
