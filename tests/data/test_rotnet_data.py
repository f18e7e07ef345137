"""RotNet's data pieces: ``ImgRotatePil`` (one random rotation, its index as the label)
and ``rotnet_collator`` (every image in all rotations), against hand-made rotations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vissl.config import AttrDict
from vissl.data import build_collate_fn
from vissl.data.collators.rotnet_collator import rotnet_collator
from vissl.data.ssl_transforms.img_rotate_pil import ImgRotatePil
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.errors import ConfigError
from vissl.losses import build_loss


def _quarter_turn(x: np.ndarray, k: int) -> np.ndarray:
    """``k`` counter-clockwise quarter turns of an (H, W) array, written out by index:
    turning counter-clockwise, row i of the result is column W - 1 - i of the input."""
    for _ in range(k % 4):
        x = np.stack([x[:, x.shape[1] - 1 - i] for i in range(x.shape[1])])
    return x


def _sample(image, index: int = 0) -> dict:
    return {"data": [image], "label": [9], "data_valid": [1], "data_idx": [index]}


@pytest.mark.parametrize("as_pil", [False, True])
def test_img_rotate_pil_rotates_by_the_label_and_replaces_the_sample_label(as_pil) -> None:
    chain = build_transforms([{"name": "ImgRotatePil", "num_angles": 4}], tensor_path=False)
    pixels = np.arange(25, dtype=np.uint8).reshape(5, 5) * 7
    labels = []
    for seed in range(16):
        image = Image.fromarray(pixels) if as_pil else torch.from_numpy(pixels)[None]
        with seeded_rng(seed):
            out = chain(_sample(image))
        label = out["label"][0]
        got = np.asarray(out["data"][0]) if as_pil else out["data"][0][0].numpy()
        np.testing.assert_array_equal(got, _quarter_turn(pixels, label))
        labels.append(label)
    assert set(labels) == {0, 1, 2, 3}  # 16 draws: every rotation comes up


def test_img_rotate_pil_with_eight_angles_turns_by_45_degrees() -> None:
    t = ImgRotatePil(num_angles=8)
    assert t.angles == [0.0, 45.0, 90.0, 135.0, 180.0, 225.0, 270.0, 315.0]
    image = torch.zeros(1, 9, 9)
    image[0, 4, 4:] = 1.0  # a ray from the centre to the right edge
    seed = next(s for s in range(100) if _label_of(t, image, s) == 1)
    with seeded_rng(seed):
        out, label = t(image)
    assert label == 1  # 45 degrees counter-clockwise: the ray points up and right
    assert out[0, 4, 6:].sum() == 0 and out[0, :4, 5:].sum() >= 3 and out[0, 5:].sum() == 0


def _label_of(t: ImgRotatePil, image: torch.Tensor, seed: int) -> int:
    with seeded_rng(seed):
        return t(image)[1]


@pytest.mark.parametrize(
    "entry,key",
    [
        ({"num_angles": 1}, "TRANSFORMS[0].num_angles"),
        ({"num_angles": "4"}, "TRANSFORMS[0].num_angles"),
        ({"num_rotations_per_img": 4}, "TRANSFORMS[0].num_rotations_per_img"),
        ({"angles": [0, 90]}, "TRANSFORMS[0].angles"),
    ],
)
def test_img_rotate_pil_config_errors_name_the_key(entry, key) -> None:
    with pytest.raises(ConfigError) as err:
        build_transforms([{"name": "ImgRotatePil", **entry}])
    assert err.value.key_path == f"config.DATA.TRAIN.{key}"


def test_rotnet_collator_gives_every_view_in_every_rotation() -> None:
    g = torch.Generator().manual_seed(0)
    batch = [
        {
            "data": [torch.rand(3, 6, 6, generator=g), torch.rand(3, 6, 6, generator=g)],
            "label": [5, 5],
            "data_valid": [1, 1],
            "data_idx": [10 + i, 10 + i],
        }
        for i in range(3)
    ]
    out = rotnet_collator(batch)
    data, label = out["data"][0], out["label"][0]
    assert data.shape == (4 * 2 * 3, 3, 6, 6)
    assert label.tolist() == [0] * 6 + [1] * 6 + [2] * 6 + [3] * 6
    assert out["data_idx"][0].tolist() == [10, 11, 12] * 8
    assert out["data_valid"][0].tolist() == [1] * 24
    for r in range(4):
        for v in range(2):
            for i in range(3):
                row = data[r * 6 + v * 3 + i]
                for c in range(3):
                    expected = _quarter_turn(batch[i]["data"][v][c].numpy(), r)
                    np.testing.assert_array_equal(row[c].numpy(), expected)


def test_rotnet_collator_from_config_and_its_errors() -> None:
    cfg = AttrDict(
        {
            "DATA": {
                "TRAIN": {
                    "COLLATE_FUNCTION": "rotnet_collator",
                    "COLLATE_FUNCTION_PARAMS": {"num_angles": 2},
                }
            }
        }
    )
    fn = build_collate_fn(cfg, "TRAIN")
    out = fn([_sample(torch.rand(1, 4, 4), i) for i in range(2)])
    assert out["label"][0].tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(out["data"][0][2:], torch.rot90(out["data"][0][:2], 2, (-2, -1)))
    cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS = {"num_angles": 1}
    with pytest.raises(ConfigError, match="num_angles"):
        build_collate_fn(cfg, "TRAIN")([_sample(torch.rand(1, 4, 4))])
    cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS = {"angles": 4}
    with pytest.raises(ConfigError, match="does not accept"):
        build_collate_fn(cfg, "TRAIN")
    with pytest.raises(ConfigError, match="ToTensor"):
        rotnet_collator([_sample(Image.new("L", (4, 4)))])


def test_rotnet_loss_is_the_cross_entropy_of_the_rotation_index() -> None:
    """RotNet's objective (Gidaris et al. 2018, eq. 1-2): the mean over images and
    rotations of -log softmax(F(rot_y(x)))[y], here on the collator's labels."""
    cfg = AttrDict({"name": "cross_entropy_multiple_output_single_target"})
    loss_fn = build_loss(cfg, AttrDict({}))
    out = rotnet_collator([_sample(torch.rand(1, 4, 4), i) for i in range(5)])
    logits = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    labels = out["label"][0]
    by_hand = (
        -sum(
            torch.log(torch.exp(logits[n, labels[n]]) / torch.exp(logits[n]).sum())
            for n in range(20)
        )
        / 20
    )
    torch.testing.assert_close(loss_fn([logits], labels), by_hand)
    torch.testing.assert_close(by_hand, F.cross_entropy(logits, labels))
