"""Jigsaw's data pieces: ``ImgPatchesFromTensor`` (a grid of jittered patches) against
slices written by hand, ``ShuffleImgPatches`` against its permutation file (the label is
the permutation's index), ``siamese_collator`` (every patch a row), and their config
errors with key paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vissl.config import AttrDict
from vissl.data import build_collate_fn
from vissl.data.collators.siamese_collator import siamese_collator
from vissl.data.ssl_transforms.img_patches_tensor import ImgPatchesFromTensor
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.data.ssl_transforms.shuffle_img_patches import ShuffleImgPatches
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.errors import ConfigError

# five permutations of four patches, written out
PERMS = np.array(
    [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2], [2, 3, 0, 1], [1, 2, 3, 0]], dtype=np.int64
)


@pytest.fixture
def perm_file(tmp_path: Path) -> str:
    path = tmp_path / "perms.npy"
    np.save(path, PERMS)
    return str(path)


def _indexed_image(channels: int, height: int, width: int) -> torch.Tensor:
    """Pixel (c, y, x) holds c * H * W + y * W + x: every value says where it is."""
    return torch.arange(channels * height * width, dtype=torch.float32).reshape(
        channels, height, width
    )


def _sample(image, index: int = 0) -> dict:
    return {"data": [image], "label": [7], "data_valid": [1], "data_idx": [index]}


@pytest.mark.parametrize("height,width,jitter", [(30, 30, 2), (20, 31, 3), (255, 255, 21)])
def test_patches_are_the_hand_sliced_cells_with_offsets_inside_the_jitter(
    height: int, width: int, jitter: int
) -> None:
    image = _indexed_image(3, height, width)
    t = ImgPatchesFromTensor(num_patches=9, patch_jitter=jitter)
    cell_h, cell_w = height // 3, width // 3
    seen_dy, seen_dx = set(), set()
    for seed in range(12):
        with seeded_rng(seed):
            patches = t(image)
        assert len(patches) == 9
        for k, patch in enumerate(patches):
            # VISSL's order: column by column
            col, row = divmod(k, 3)
            top, left = divmod(int(patch[0, 0, 0].item()), width)
            dy, dx = top - row * cell_h, left - col * cell_w
            assert 0 <= dy < jitter and 0 <= dx < jitter, (k, dy, dx)
            seen_dy.add(dy)
            seen_dx.add(dx)
            expected = image[:, top : top + cell_h - jitter, left : left + cell_w - jitter]
            assert patch.shape == (3, cell_h - jitter, cell_w - jitter)
            torch.testing.assert_close(patch, expected, rtol=0, atol=0)
    if jitter <= 3:  # 108 draws of each offset: every value of a small jitter comes up
        assert seen_dy == seen_dx == set(range(jitter))


def test_patches_repeat_with_the_seed_and_are_copies() -> None:
    image = torch.rand(3, 24, 24, generator=torch.Generator().manual_seed(0))
    t = ImgPatchesFromTensor(num_patches=4, patch_jitter=3)
    with seeded_rng(5):
        first = t(image)
    with seeded_rng(5):
        again = t(image)
    with seeded_rng(6):
        other = t(image)
    assert len(first) == 4 and first[0].shape == (3, 9, 9)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    before = image.clone()
    first[0].fill_(-1.0)  # a patch owns its memory
    assert torch.equal(image, before)


def test_numpy_patches_equal_tensor_patches() -> None:
    """PIRL cuts uint8 (C, H, W) arrays: the same cells, as numpy copies."""
    array = np.random.default_rng(0).integers(0, 256, (3, 27, 27), dtype=np.uint8)
    t = ImgPatchesFromTensor(num_patches=9, patch_jitter=2)
    with seeded_rng(3):
        from_numpy = t(array)
    with seeded_rng(3):
        from_tensor = t(torch.from_numpy(array))
    assert all(isinstance(p, np.ndarray) and p.flags["OWNDATA"] for p in from_numpy)
    for a, b in zip(from_numpy, from_tensor):
        np.testing.assert_array_equal(a, b.numpy())


def test_shuffle_reorders_by_the_drawn_permutation_and_labels_its_index(perm_file: str) -> None:
    t = ShuffleImgPatches(perm_file)
    assert (t.num_perms, t.num_patches) == (5, 4)
    patches = [torch.full((1, 2, 2), float(k)) for k in range(4)]
    labels = set()
    for seed in range(40):
        with seeded_rng(seed):
            out, label = t(patches)
        assert isinstance(label, int) and 0 <= label < 5
        assert out.shape == (4, 1, 2, 2)
        # output patch k is input patch PERMS[label][k]
        assert [int(out[k, 0, 0, 0]) for k in range(4)] == PERMS[label].tolist()
        labels.add(label)
    assert labels == set(range(5))


def test_permutations_numbered_from_one_are_shifted(tmp_path: Path) -> None:
    path = tmp_path / "one_based.npy"
    np.save(path, PERMS + 1)
    np.testing.assert_array_equal(ShuffleImgPatches(str(path)).perms, PERMS)


def test_the_chain_gives_shuffled_patches_and_replaces_the_label(perm_file: str) -> None:
    entries = [
        {"name": "ImgPatchesFromTensor", "num_patches": 4, "patch_jitter": 2},
        {"name": "ShuffleImgPatches", "perm_file": perm_file},
    ]
    chain = build_transforms(entries)
    image = _indexed_image(3, 16, 16)
    for seed in range(6):
        with seeded_rng(seed):
            out = chain(_sample(image))
        with seeded_rng(seed):  # the same draws: the patches come first
            unshuffled = ImgPatchesFromTensor(num_patches=4, patch_jitter=2)(image)
        label = out["label"][0]
        data = out["data"][0]
        assert data.shape == (4, 3, 6, 6)
        for k in range(4):
            assert torch.equal(data[k], unshuffled[PERMS[label][k]])


def test_shipped_permutation_file_is_found_from_any_folder(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    t = ShuffleImgPatches("configs/jigsaw_permutations/hamming_perms_100_patches_9_max_avg.npy")
    assert (t.num_perms, t.num_patches) == (100, 9)
    assert len({tuple(r) for r in t.perms.tolist()}) == 100


@pytest.mark.parametrize(
    "entry,key",
    [
        ({"num_patches": 8}, "TRANSFORMS[0].num_patches"),
        ({"num_patches": "9"}, "TRANSFORMS[0].num_patches"),
        ({"patch_jitter": 0}, "TRANSFORMS[0].patch_jitter"),
        ({"patch_jitter": 2.5}, "TRANSFORMS[0].patch_jitter"),
        ({"jitter": 2}, "TRANSFORMS[0].jitter"),
    ],
)
def test_img_patches_config_errors_name_the_key(entry: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_transforms([{"name": "ImgPatchesFromTensor", **entry}])
    assert err.value.key_path == f"config.DATA.TRAIN.{key}"


def test_img_patches_input_errors_name_the_key() -> None:
    chain = build_transforms([{"name": "ImgPatchesFromTensor", "patch_jitter": 21}])
    with pytest.raises(ConfigError, match="no larger than patch_jitter=21") as err:
        chain(_sample(torch.zeros(3, 60, 60)))  # 20 px cells
    assert err.value.key_path == "config.DATA.TRAIN.TRANSFORMS[0].patch_jitter"
    with pytest.raises(ConfigError, match="after ToTensor") as err:
        chain(_sample(Image.new("RGB", (255, 255))))
    assert err.value.key_path == "config.DATA.TRAIN.TRANSFORMS[0]"


def test_shuffle_config_errors_name_the_key(tmp_path: Path, perm_file: str) -> None:
    key = "config.DATA.TRAIN.TRANSFORMS[1].perm_file"
    patches = {"name": "ImgPatchesFromTensor", "num_patches": 9, "patch_jitter": 2}
    not_perms = tmp_path / "bad.npy"
    np.save(not_perms, np.array([[0, 1, 2, 3], [0, 0, 1, 2]]))
    floats = tmp_path / "floats.npy"
    np.save(floats, PERMS.astype(np.float32))
    cases = [
        ({}, "is missing"),
        ({"perm_file": str(tmp_path / "none.npy")}, "not found"),
        ({"perm_file": str(not_perms)}, r"row 1 .* is not a permutation of 0\.\.3"),
        ({"perm_file": str(floats)}, "not integers"),
        ({"perm_file": 3}, "must name a .npy file"),
    ]
    for entry, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            build_transforms([patches, {"name": "ShuffleImgPatches", **entry}])
        assert err.value.key_path == key
    with pytest.raises(ConfigError) as err:
        build_transforms([patches, {"name": "ShuffleImgPatches", "perm_file": perm_file, "n": 1}])
    assert err.value.key_path == "config.DATA.TRAIN.TRANSFORMS[1].n"
    # permutations of 4 patches, 9 patches cut: found on the first sample
    chain = build_transforms([patches, {"name": "ShuffleImgPatches", "perm_file": perm_file}])
    with pytest.raises(ConfigError, match="permutations of 4 patches but the sample has 9") as err:
        chain(_sample(torch.zeros(3, 24, 24)))
    assert err.value.key_path == key


def _jigsaw_sample(index: int, num_patches: int = 9, label=None) -> dict:
    g = torch.Generator().manual_seed(index)
    patches = torch.rand(num_patches, 3, 4, 4, generator=g)
    return {
        "data": [patches],
        "label": [index + 10 if label is None else label],
        "data_valid": [1],
        "data_idx": [100 + index],
    }


def test_siamese_collator_lays_each_images_patches_on_consecutive_rows() -> None:
    batch = [_jigsaw_sample(i) for i in range(3)]
    out = siamese_collator(batch)
    data = out["data"][0]
    assert data.shape == (27, 3, 4, 4)
    for i in range(3):
        for t in range(9):
            assert torch.equal(data[i * 9 + t], batch[i]["data"][0][t])
    assert out["label"][0].tolist() == [10, 11, 12]
    assert out["data_idx"][0].tolist() == [100, 101, 102]
    assert out["data_valid"][0].tolist() == [1, 1, 1]
    # VISSL's ShuffleImgPatches gave LongTensor([index]) labels: still one per image
    vissl_style = [_jigsaw_sample(i, label=torch.tensor([i])) for i in range(3)]
    assert siamese_collator(vissl_style)["label"][0].tolist() == [0, 1, 2]


def test_siamese_collator_with_two_views_is_view_major() -> None:
    batch = []
    for i in range(2):
        a, b = _jigsaw_sample(i, 4), _jigsaw_sample(10 + i, 4)
        batch.append(
            {
                "data": [a["data"][0], b["data"][0]],
                "label": [i, 5 + i],
                "data_valid": [1, 1],
                "data_idx": [i, i],
            }
        )
    out = siamese_collator(batch)
    data = out["data"][0]
    assert data.shape == (16, 3, 4, 4)
    for v in range(2):
        for i in range(2):
            for t in range(4):
                assert torch.equal(data[(v * 2 + i) * 4 + t], batch[i]["data"][v][t])
    assert out["label"][0].tolist() == [0, 1, 5, 6]


def test_siamese_collator_from_config_and_its_errors() -> None:
    cfg = AttrDict({"DATA": {"TRAIN": {"COLLATE_FUNCTION": "siamese_collator"}}})
    fn = build_collate_fn(cfg, "TRAIN")
    assert fn([_jigsaw_sample(0)])["data"][0].shape == (9, 3, 4, 4)
    with pytest.raises(ConfigError, match="ImgPatchesFromTensor and ShuffleImgPatches"):
        fn([_sample(torch.zeros(3, 4, 4))])  # an image, not a stack of patches
    with pytest.raises(ConfigError, match="differ in shape"):
        fn([_jigsaw_sample(0, 9), _jigsaw_sample(1, 4)])
