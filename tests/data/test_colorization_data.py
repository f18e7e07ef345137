"""Colorization's data side: the sRGB -> Lab conversion (against skimage when installed,
else against the CIE formulas written out here, and published values), ImgPil2LabTensor
(VISSL's L - 50 scaling), the in-gamut ab bins (each one reached by an sRGB colour, every
sRGB colour in one) and colorization_collator (ab of the input as the label)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from PIL import Image

from vissl.data.collators.colorization_collator import colorization_collator
from vissl.data.ssl_transforms.img_pil_to_lab_tensor import ImgPil2LabTensor
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.errors import ConfigError
from vissl.utils.lab_color import in_gamut_ab_bins, lab_to_srgb, srgb_to_lab

# ---------------------------------------------------------------- reference conversion
# CIE 1976 L*a*b* from sRGB, written from the definitions: sRGB companding (IEC 61966-2-1),
# the sRGB primaries' XYZ (D65), and the CIE constants epsilon = 216/24389,
# kappa = 24389/27 for the linear segment near black.
_M = [
    [0.412453, 0.357580, 0.180423],
    [0.212671, 0.715160, 0.072169],
    [0.019334, 0.119193, 0.950227],
]
_WHITE = (0.95047, 1.0, 1.08883)
_EPS = 216.0 / 24389.0
_KAPPA = 24389.0 / 27.0


def ref_lab(r: float, g: float, b: float) -> tuple[float, float, float]:
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    rgb = [linear(c) for c in (r, g, b)]
    xyz = [sum(_M[i][j] * rgb[j] for j in range(3)) / _WHITE[i] for i in range(3)]
    f = [t ** (1 / 3) if t > _EPS else (_KAPPA * t + 16) / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def ref_lab_array(rgb: np.ndarray) -> np.ndarray:
    """The same formulas on an (P, 3) array (float64)."""
    c = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = c @ np.array(_M).T / np.array(_WHITE)
    f = np.where(xyz > _EPS, np.cbrt(xyz), (_KAPPA * xyz + 16) / 116)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], 1)


def _as_image(rgb: torch.Tensor) -> torch.Tensor:  # (P, 3) -> (3, P, 1)
    return rgb.t().unsqueeze(-1)


def test_srgb_to_lab_matches_the_cie_formulas_and_skimage_if_installed() -> None:
    rng = np.random.RandomState(0)
    colours = np.concatenate(
        [rng.rand(200, 3), np.eye(3), [[0, 0, 0], [1, 1, 1], [0.02, 0.01, 0.03]]]
    )
    got = srgb_to_lab(_as_image(torch.from_numpy(colours)))[..., 0].t().numpy()
    expected = np.array([ref_lab(*c) for c in colours])
    np.testing.assert_allclose(got, expected, atol=1e-6)
    if importlib.util.find_spec("skimage") is not None:
        from skimage.color import rgb2lab

        np.testing.assert_allclose(got, rgb2lab(colours[None])[0], atol=1e-4)
    # float32 input (what the transform uses) within 1e-3
    got32 = srgb_to_lab(_as_image(torch.from_numpy(colours).float()))[..., 0].t().numpy()
    np.testing.assert_allclose(got32, expected, atol=1e-3)


@pytest.mark.parametrize(
    ("rgb", "lab"),
    [  # published CIELAB (D65) of the sRGB primaries and secondaries
        ((1.0, 0.0, 0.0), (53.24, 80.09, 67.20)),
        ((0.0, 1.0, 0.0), (87.73, -86.18, 83.18)),
        ((0.0, 0.0, 1.0), (32.30, 79.19, -107.86)),
        ((1.0, 1.0, 0.0), (97.14, -21.55, 94.48)),
        ((1.0, 0.0, 1.0), (60.32, 98.23, -60.82)),
        ((1.0, 1.0, 1.0), (100.0, 0.0, 0.0)),
        ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    ],
)
def test_srgb_to_lab_published_values(rgb, lab) -> None:
    got = srgb_to_lab(_as_image(torch.tensor([rgb], dtype=torch.float64)))[:, 0, 0]
    assert got.tolist() == pytest.approx(lab, abs=0.01)


def test_lab_to_srgb_inverts_srgb_to_lab() -> None:
    rgb = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(lab_to_srgb(srgb_to_lab(rgb)), rgb, atol=1e-9, rtol=0)


# ---------------------------------------------------------------- ImgPil2LabTensor
def test_img_pil_2_lab_tensor_is_l_minus_50_a_b() -> None:
    pixels = (np.random.RandomState(2).rand(5, 7, 3) * 255).astype(np.uint8)
    out = ImgPil2LabTensor()(Image.fromarray(pixels))
    assert out.shape == (3, 5, 7) and out.dtype == torch.float32
    for y, x in [(0, 0), (4, 6), (2, 3)]:
        L, a, b = ref_lab(*(pixels[y, x] / 255.0))
        assert out[:, y, x].tolist() == pytest.approx([L - 50, a, b], abs=2e-3)
    # the same image as a ToTensor tensor, or as uint8 channels-first, gives the same
    as_float = torch.from_numpy(pixels).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(ImgPil2LabTensor()(as_float), out)
    torch.testing.assert_close(ImgPil2LabTensor()(torch.from_numpy(pixels).permute(2, 0, 1)), out)


def test_gray_images_have_no_colour() -> None:
    gray = Image.fromarray((np.arange(16).reshape(4, 4) * 16).astype(np.uint8), mode="L")
    out = ImgPil2LabTensor()(gray)
    assert out.shape == (3, 4, 4)
    assert out[1:].abs().max() < 0.01  # a = b = 0 up to the sRGB matrix's rounding
    assert out[0].min() == pytest.approx(-50.0) and out[0].max() > 40


def test_img_pil_2_lab_tensor_in_a_config_chain_and_bad_inputs() -> None:
    image = Image.fromarray((np.random.RandomState(3).rand(8, 8, 3) * 255).astype(np.uint8))
    entries = [{"name": "RandomResizedCrop", "size": 16}, {"name": "ImgPil2LabTensor"}]
    outs = []
    for tensor_path in (True, False):
        chain = build_transforms(entries, tensor_path=tensor_path)
        with seeded_rng(5):
            sample = chain({"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]})
        outs.append(sample["data"][0])
    assert outs[0].shape == (3, 16, 16)
    torch.testing.assert_close(outs[0], outs[1])
    with pytest.raises(ValueError, match="before Normalize"):
        ImgPil2LabTensor()(torch.zeros(1, 4, 4))


# ---------------------------------------------------------------- in-gamut bins
def test_every_bin_is_reached_by_an_srgb_colour() -> None:
    centers, witnesses = in_gamut_ab_bins(10)
    assert centers.shape == (262, 2)  # the count docs/methods/colorization.md states
    assert torch.equal(centers, torch.round(centers / 10) * 10)  # on the grid of 10
    assert len({tuple(c) for c in centers.tolist()}) == centers.shape[0]
    assert bool(((witnesses >= 0) & (witnesses <= 1)).all())  # valid sRGB colours
    ab = ref_lab_array(witnesses.numpy())[:, 1:]
    # each witness's ab lies in its bin's cell (nearest grid point = the centre)
    np.testing.assert_array_equal(np.round(ab / 10) * 10, centers.numpy())


def test_every_srgb_colour_falls_in_a_bin() -> None:
    centers, _ = in_gamut_ab_bins(10)
    kept = {tuple(c) for c in (centers.numpy() / 10).astype(int).tolist()}
    rng = np.random.RandomState(4)
    v = np.linspace(0, 1, 97)
    g, b = np.meshgrid(v, v, indexing="ij")
    faces = [
        np.insert(np.stack([g.ravel(), b.ravel()], 1), axis, value, axis=1)
        for axis in range(3)
        for value in (0.0, 1.0)
    ]
    colours = np.concatenate([rng.rand(100_000, 3), *faces])
    cells = np.round(ref_lab_array(colours)[:, 1:] / 10).astype(int)
    assert {tuple(c) for c in np.unique(cells, axis=0).tolist()} <= kept
    # what the docs say of Zhang et al.'s 313: (a, b) = (100, 0) is out of the sRGB gamut
    lab = ref_lab_array(colours)
    assert (100 // 10, 0) not in kept
    assert not np.any((lab[:, 1] >= 95) & (np.abs(lab[:, 2]) <= 5))
    assert lab[:, 1].max() < 98.3  # magenta's a, 98.23, is the largest


def test_other_grid_sizes() -> None:
    coarse, _ = in_gamut_ab_bins(20, samples_per_edge=128)
    assert torch.equal(coarse, torch.round(coarse / 20) * 20)
    assert 50 < coarse.shape[0] < 262


# ---------------------------------------------------------------- collator
def test_colorization_collator_gives_the_ab_as_label() -> None:
    lab = [
        ImgPil2LabTensor()(torch.rand(3, 4, 4, generator=torch.Generator().manual_seed(i)))
        for i in range(3)
    ]
    batch = [
        {"data": [x], "label": [7], "data_valid": [1], "data_idx": [i]} for i, x in enumerate(lab)
    ]
    out = colorization_collator(batch)
    assert torch.equal(out["data"][0], torch.stack(lab))
    assert torch.equal(out["label"][0], torch.stack(lab)[:, 1:])
    assert out["data_idx"][0].tolist() == [0, 1, 2]
    gray = [{"data": [torch.zeros(1, 4, 4)], "label": [0], "data_valid": [1], "data_idx": [0]}]
    with pytest.raises(ConfigError) as err:
        colorization_collator(gray)
    assert err.value.key_path == "config.DATA.<split>.TRANSFORMS"
    assert "ImgPil2LabTensor" in str(err.value)
    assert math.isfinite(float(out["label"][0].abs().max()))
