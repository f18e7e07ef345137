"""CIE Lab colour: sRGB <-> Lab (D65) and the in-gamut ab bins of colorization.

Colorization (Zhang, Isola, Efros, ECCV 2016) predicts the ab channels of an image from
its lightness L, as a distribution over a grid of ab bins. This module holds the colour
arithmetic it needs, with no dependency above ``torch``:

- :func:`srgb_to_lab` / :func:`lab_to_srgb`: the standard conversions of sRGB (IEC
  61966-2-1, D65 white ``(0.95047, 1, 1.08883)``, 2 degree observer) to CIE L*a*b* and
  back, on channel-first tensors with values in [0, 1]; ``L`` in [0, 100].
- :func:`in_gamut_ab_bins`: the centres of the ab grid cells (side ``grid_size``, centres
  at multiples of it) that hold the ab of at least one sRGB colour, generated from the
  colours themselves. The ab footprint of the sRGB gamut (a solid in Lab) is the
  projection of its boundary, the six faces of the RGB cube, so those faces are sampled
  (``samples_per_edge`` values per edge) and converted. With the default grid of 10 this
  gives 262 bins: a from -90 to 100, b from -110 to 90. Zhang et al. released 313 bins
  (``pts_in_hull.npy``), which include cells no sRGB colour reaches, e.g. (a, b) =
  (100, 0), while the largest a of sRGB, 98.2, is that of magenta, at b = -60.8; their
  file can be given to the loss instead (``colorization_loss.bin_centers_file``).
"""

from __future__ import annotations

import functools

import torch

#: CIE XYZ of the D65 white point (2 degree observer), as skimage and OpenCV use.
D65_WHITE: tuple[float, float, float] = (0.95047, 1.0, 1.08883)
#: linear sRGB -> XYZ (D65)
_RGB_TO_XYZ = torch.tensor(
    [
        [0.412453, 0.357580, 0.180423],
        [0.212671, 0.715160, 0.072169],
        [0.019334, 0.119193, 0.950227],
    ],
    dtype=torch.float64,
)
_DELTA = 6.0 / 29.0


def _srgb_to_linear(c: torch.Tensor) -> torch.Tensor:
    return torch.where(c <= 0.04045, c / 12.92, ((c.clamp(min=0.0) + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(c: torch.Tensor) -> torch.Tensor:
    return torch.where(
        c <= 0.0031308, 12.92 * c, 1.055 * c.clamp(min=0.0031308) ** (1.0 / 2.4) - 0.055
    )


def _f(t: torch.Tensor) -> torch.Tensor:
    return torch.where(
        t > _DELTA**3, t.clamp(min=_DELTA**3) ** (1.0 / 3.0), t / (3 * _DELTA**2) + 4.0 / 29.0
    )


def _f_inv(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t > _DELTA, t**3, 3 * _DELTA**2 * (t - 4.0 / 29.0))


def _matrix(like: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    m = torch.linalg.inv(_RGB_TO_XYZ) if inverse else _RGB_TO_XYZ
    return m.to(device=like.device, dtype=like.dtype)


def srgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """CIE Lab of sRGB values in [0, 1], channels at dim -3: ``(..., 3, H, W)``.

    Returns:
        ``(..., 3, H, W)``: L in [0, 100], a and b (about -86..98 and -108..94 in gamut).
    """
    if rgb.dim() < 3 or rgb.shape[-3] != 3:
        raise ValueError(f"srgb_to_lab expects (..., 3, H, W), got shape {tuple(rgb.shape)}")
    x = rgb if rgb.is_floating_point() else rgb.float()
    linear = _srgb_to_linear(x)
    xyz = torch.einsum("ij,...jhw->...ihw", _matrix(x), linear)
    white = torch.tensor(D65_WHITE, device=x.device, dtype=x.dtype).view(3, 1, 1)
    fx, fy, fz = _f(xyz / white).unbind(dim=-3)
    return torch.stack([116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)], dim=-3)


def lab_to_srgb(lab: torch.Tensor) -> torch.Tensor:
    """sRGB of CIE Lab values, channels at dim -3; not clipped (out of gamut: outside
    [0, 1])."""
    if lab.dim() < 3 or lab.shape[-3] != 3:
        raise ValueError(f"lab_to_srgb expects (..., 3, H, W), got shape {tuple(lab.shape)}")
    L, a, b = lab.unbind(dim=-3)
    fy = (L + 16.0) / 116.0
    f = torch.stack([fy + a / 500.0, fy, fy - b / 200.0], dim=-3)
    white = torch.tensor(D65_WHITE, device=lab.device, dtype=lab.dtype).view(3, 1, 1)
    xyz = _f_inv(f) * white
    return _linear_to_srgb(torch.einsum("ij,...jhw->...ihw", _matrix(lab, inverse=True), xyz))


def _cube_faces(samples_per_edge: int) -> torch.Tensor:
    """The six faces of the RGB unit cube, ``samples_per_edge`` values per edge:
    ``(3, 6 * n * n, 1)`` (channels first, as :func:`srgb_to_lab` takes)."""
    v = torch.linspace(0.0, 1.0, samples_per_edge, dtype=torch.float32)
    u, w = torch.meshgrid(v, v, indexing="ij")
    faces = []
    for axis in range(3):
        for value in (0.0, 1.0):
            cols = [u.reshape(-1), w.reshape(-1)]
            cols.insert(axis, torch.full_like(cols[0], value))
            faces.append(torch.stack(cols))
    return torch.cat(faces, dim=1).unsqueeze(-1)


@functools.lru_cache(maxsize=4)
def in_gamut_ab_bins(
    grid_size: int = 10, samples_per_edge: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ab bins of the sRGB gamut on a grid of ``grid_size`` (see the module docstring).

    A bin is the cell of the points nearer to its centre than to any other grid point
    (``round(ab / grid_size)``); it is kept when the ab of some sRGB colour falls in it.

    Args:
        grid_size: the side of the cells in ab units (Zhang et al.: 10).
        samples_per_edge: values per edge of the RGB cube's faces that are converted
            (512: 1.5 million colours; finer sampling finds no other bin).

    Returns:
        ``(centers, witnesses)``: ``centers`` ``(Q, 2)`` float32 ab centres sorted by a then
        b; ``witnesses`` ``(Q, 3)`` float64, for each bin one sRGB colour in [0, 1] whose
        ab lies in its cell (what the tests check independently).
    """
    if grid_size <= 0:
        raise ValueError(f"grid_size must be positive, got {grid_size}")
    rgb = _cube_faces(samples_per_edge)
    ab = srgb_to_lab(rgb)[1:, :, 0]  # (2, P)
    cells = torch.round(ab / grid_size).to(torch.int64)
    # one integer key per cell (a-major, so sorted keys are sorted by a then b)
    low = int(cells.min())
    span = int(cells.max()) - low + 1
    keys = (cells[0] - low) * span + (cells[1] - low)
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((unique.shape[0],), keys.shape[0], dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(keys.shape[0]), reduce="amin")
    centers = torch.stack([unique // span + low, unique % span + low], dim=1) * grid_size
    witnesses = rgb[:, first, 0].t().to(torch.float64).contiguous()
    return centers.to(torch.float32), witnesses
    return centers, witnesses
