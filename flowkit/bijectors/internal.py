r"""Internal coordinates of a molecule: a Z-matrix of bonds, angles and dihedrals with three Cartesian anchor atoms.

Each non-anchor atom $i$ of the Z-matrix has three partners $(b, a, d)$ placed before it; it is described by the bond
length $r = |x_i - x_b|$, the angle $\theta = \angle(x_i, x_b, x_a)$ and the dihedral $\varphi$ of
$(x_i, x_b, x_a, x_d)$. Three anchor atoms $(c_0, c_1, c_2)$ fix the frame ($c_0$ at the origin, $c_1$ on the positive
$x$ axis, $c_2$ in the $xy$ plane with $y > 0$) and keep the bonds $|x_{c_1} - x_{c_0}|$, $|x_{c_2} - x_{c_0}|$ and the
angle $\angle(x_{c_1}, x_{c_0}, x_{c_2})$: a molecule of $n$ atoms has $3n - 6$ coordinates.

Log-Jacobian (the map from the $3n - 6$ free Cartesian coordinates of the anchored frame
to internal coordinates): placing an atom from $(r, \theta, \varphi)$ has volume element
$r^2 \sin\theta$, and placing $c_2$ from its bond and angle in the plane has $r_{c_2}$, so

$$
\log\left|\det \frac{\partial q}{\partial x}\right| = -\sum_{\text{rows}} \log(r^2 \sin\theta) - \log r_{c_2}.
$$

The coordinates are normalised around a reference (minimum-energy) frame: bonds and angles as $(q - q_{ref}) / s$,
dihedrals as $w(\varphi - \varphi_{ref}) / s$ with $w$ the wrap into $[-\pi, \pi)$, except the *circular* dihedrals,
which keep the scale 1 (model them with [`CircularSplineCoupling`][flowkit.bijectors.CircularSplineCoupling]). Latent
layout: the bonds (rows, then the two anchor bonds), the angles (rows, then the anchor angle), the dihedrals (rows).

References:
    Noé, Olsson, Köhler & Wu, *Boltzmann generators*, Science 365 (2019) (arXiv:1812.01729);
    Midgley, Stimper et al., *Flow annealed importance sampling bootstrap*, ICLR 2023
    (arXiv:2208.01893), whose Z-matrix and normalisation this follows;
    Parsons et al., *Practical conversion from torsion space to Cartesian space for in silico
    protein synthesis*, J. Comput. Chem. 26 (2005) (the NeRF placement).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import check_number
from ..domains import Domain, Real
from .base import Bijector

__all__ = ["InternalCoordinates", "bond_angle", "dihedral", "signed_volume", "same_chirality"]


def _normalize(v: Tensor) -> Tensor:
    return v / v.norm(dim=-1, keepdim=True)


def bond_angle(p0: Tensor, p1: Tensor, p2: Tensor) -> Tensor:
    r"""Angle $\angle(p_0, p_1, p_2) \in [0, \pi]$ at `p1`, of points `(..., 3)`."""
    u, v = p0 - p1, p2 - p1
    return torch.atan2(torch.linalg.cross(u, v).norm(dim=-1), (u * v).sum(-1))


def dihedral(p0: Tensor, p1: Tensor, p2: Tensor, p3: Tensor) -> Tensor:
    r"""Dihedral angle $\in (-\pi, \pi]$ of points `(..., 3)`: between planes $(p_0, p_1, p_2)$ and $(p_1, p_2, p_3)$.

    The IUPAC sign convention (as in OpenMM and MDTraj), so that the backbone angles
    $\phi$ and $\psi$ of a peptide come out as in a Ramachandran plot.
    """
    b0, b1, b2 = p1 - p0, p2 - p1, p3 - p2
    n1, n2 = torch.linalg.cross(b0, b1), torch.linalg.cross(b1, b2)
    return torch.atan2((torch.linalg.cross(n1, n2) * _normalize(b1)).sum(-1), (n1 * n2).sum(-1))


def signed_volume(x: Tensor, centre: int, a: int, b: int, c: int) -> Tensor:
    r"""Signed volume $(x_a - x_o) \cdot ((x_b - x_o) \times (x_c - x_o))$ around atom `centre` $o$.

    Arguments:
        x: positions `(..., 3n)`.
        centre: the atom $o$.
        a: first partner.
        b: second partner.
        c: third partner.
    """
    pos = x.unflatten(-1, (-1, 3))
    o = pos[..., centre, :]
    return ((pos[..., a, :] - o) * torch.linalg.cross(pos[..., b, :] - o, pos[..., c, :] - o)).sum(-1)


def same_chirality(x: Tensor, reference: Tensor, centres: Sequence[Sequence[int]]) -> Tensor:
    """Whether each configuration has the handedness of `reference` at every chiral centre (False: a mirror image).

    Arguments:
        x: positions `(..., 3n)`.
        reference: one configuration `(3n,)` of the right handedness.
        centres: chiral centres, each `(centre, a, b, c)`: the signed volume spanned by
            the bonds to `a`, `b` and `c` has the sign it has in `reference`.

    Returns:
        Boolean tensor of the batch shape.

    Examples:
        >>> import torch
        >>> ref = torch.tensor([0.0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1])
        >>> same_chirality(torch.stack([ref, -ref]), ref, [(0, 1, 2, 3)])
        tensor([ True, False])
    """
    ok = torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
    for centre in centres:
        if len(centre) != 4:
            raise ValueError(f"same_chirality: a chiral centre is (centre, a, b, c), got {tuple(centre)}")
        sign = torch.sign(signed_volume(reference.to(x), *centre))
        ok = ok & (torch.sign(signed_volume(x, *centre)) == sign)
    return ok


def _wrap(angle: Tensor) -> Tensor:
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def _place(pb: Tensor, pa: Tensor, pd: Tensor, r: Tensor, theta: Tensor, phi: Tensor) -> Tensor:
    """The point at bond `r` from `pb`, angle `theta` with `pa` and dihedral `phi` with `pa, pd` (NeRF)."""
    e = _normalize(pa - pb)
    w = _normalize(torch.linalg.cross(torch.linalg.cross(e, pd - pa), e))  # the part of pd - pa normal to e
    v = torch.cos(phi)[..., None] * w - torch.sin(phi)[..., None] * torch.linalg.cross(e, w)
    return pb + r[..., None] * (torch.cos(theta)[..., None] * e + torch.sin(theta)[..., None] * v)


class _AnchoredFrame(Domain):
    """Positions `(3n,)` in the anchored frame: a linear manifold of dimension `3n - 6` (tests: noisy reference)."""

    is_manifold = True

    def __init__(self, reference: Tensor, anchors: tuple[int, int, int], scale: float = 0.01) -> None:
        self.reference = reference
        self.anchors = anchors
        self.scale = scale
        fixed = {3 * anchors[0], 3 * anchors[0] + 1, 3 * anchors[0] + 2, 3 * anchors[1] + 1, 3 * anchors[1] + 2}
        fixed.add(3 * anchors[2] + 2)
        self.free = [k for k in range(reference.numel()) if k not in fixed]

    def to_frame(self, x: Tensor) -> Tensor:
        """Move configurations `(..., 3n)` rigidly into the anchored frame."""
        pos = x.unflatten(-1, (-1, 3))
        c0, c1, c2 = (pos[..., i : i + 1, :] for i in self.anchors)
        ex = _normalize(c1 - c0)
        ez = _normalize(torch.linalg.cross(ex, c2 - c0))
        ey = torch.linalg.cross(ez, ex)
        rotation = torch.cat([ex, ey, ez], dim=-2)  # rows: the new axes
        return ((pos - c0) @ rotation.transpose(-1, -2)).flatten(-2)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        noise = torch.randn(shape, dtype=dtype, generator=generator)
        return self.to_frame(self.reference.to(dtype) + self.scale * noise)

    def contains(self, x: Tensor) -> Tensor:
        return torch.isfinite(x)

    def tangent_basis(self, x: Tensor) -> Tensor:
        n = x.shape[-1]
        eye = torch.eye(n, dtype=x.dtype, device=x.device)[:, self.free]
        return eye.expand(*x.shape[:-1], n, len(self.free))

    def __repr__(self) -> str:
        return f"AnchoredFrame(anchors={self.anchors})"


def _levels(rows: list[tuple[int, tuple[int, int, int]]], anchors: Sequence[int], n_atoms: int) -> list[list[int]]:
    """Z-matrix rows grouped into levels: every partner of a row is an anchor or placed in an earlier level."""
    placed = set(anchors)
    atoms = [atom for atom, _ in rows]
    if sorted(atoms + list(anchors)) != list(range(n_atoms)):
        raise ValueError(
            f"InternalCoordinates: the Z-matrix atoms and the anchors must list each of the {n_atoms} atoms once, "
            f"got atoms {sorted(atoms)} and anchors {list(anchors)}"
        )
    for atom, partners in rows:
        if len(set(partners)) != 3 or atom in partners:
            raise ValueError(f"InternalCoordinates: row {atom} needs three distinct partners, got {partners}")
    left, levels = list(range(len(rows))), []
    while left:
        level = [k for k in left if all(p in placed for p in rows[k][1])]
        if not level:
            raise ValueError(
                "InternalCoordinates: the Z-matrix has rows whose partners are never placed (a cycle): "
                f"{[rows[k] for k in left]}"
            )
        levels.append(level)
        placed.update(rows[k][0] for k in level)
        left = [k for k in left if k not in level]
    return levels


class InternalCoordinates(Bijector):
    r"""Cartesian positions `(3n,)` to `3n - 6` normalised internal coordinates (Z-matrix and three anchors).

    See the module docstring for the coordinates, the log-Jacobian and the normalisation. `forward` accepts
    molecules in any position and orientation; `inverse` builds them in the anchored frame. A mirror image
    has negated dihedrals: check samples with [`same_chirality`][flowkit.bijectors.internal.same_chirality].

    Arguments:
        z_matrix: rows `(atom, (bond partner, angle partner, dihedral partner))`, one per
            non-anchor atom, whose partners are anchors or atoms of other rows (in any order).
        anchors: the three anchor atoms `(c0, c1, c2)`.
        reference: the reference configuration, `3n` numbers in nm (a minimum-energy frame).
        circular: Z-matrix rows whose dihedrals are circular (scale 1, on $[-\pi, \pi)$).
        bond_scale: scale of the bonds, nm.
        angle_scale: scale of the angles, rad.
        dihedral_scale: scale of the non-circular dihedrals, rad.

    Attributes:
        circular_idx: indices of the circular latent coordinates.

    Examples:
        >>> import torch
        >>> ref = [0.0, 0, 0, 0.1, 0, 0, 0, 0.1, 0, 0, 0, 0.1, 0.1, 0.1, 0.1]  # 5 atoms
        >>> ic = InternalCoordinates([(3, (0, 1, 2)), (4, (0, 1, 2))], (0, 1, 2), ref)
        >>> z, ladj = ic(torch.tensor(ref))
        >>> z.shape, bool(z.abs().max() < 1e-6)
        (torch.Size([9]), True)
    """

    def __init__(
        self,
        z_matrix: Sequence[tuple[int, Sequence[int]]],
        anchors: Sequence[int],
        reference: Sequence[float] | Tensor,
        circular: Sequence[int] = (),
        bond_scale: float = 0.005,
        angle_scale: float = 0.15,
        dihedral_scale: float = 0.2,
    ) -> None:
        super().__init__()
        where = "InternalCoordinates"
        ref = torch.as_tensor(reference, dtype=torch.float64).flatten()
        if ref.numel() % 3 or ref.numel() < 9 or not bool(torch.isfinite(ref).all()):
            raise ValueError(f"{where}: reference must be 3n finite numbers (n >= 3 atoms), got {ref.numel()}")
        n = ref.numel() // 3
        try:
            rows = [(int(atom), tuple(int(p) for p in partners)) for atom, partners in z_matrix]
            anchor_t = tuple(int(a) for a in anchors)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: z_matrix rows are (atom, (b, a, d)) and anchors three atoms") from None
        if len(anchor_t) != 3 or len(set(anchor_t)) != 3:
            raise ValueError(f"{where}: anchors must be three distinct atoms, got {anchor_t}")
        if any(not 0 <= a < n for a in anchor_t) or any(not 0 <= p < n for _, ps in rows for p in ps):
            raise ValueError(f"{where}: atom indices must lie in [0, {n})")
        circular_rows = sorted({int(k) for k in circular})
        if any(not 0 <= k < len(rows) for k in circular_rows):
            raise ValueError(f"{where}: circular rows must lie in [0, {len(rows)}), got {list(circular)}")
        self.bond_scale = check_number(bond_scale, "bond_scale", where=where, positive=True)
        self.angle_scale = check_number(angle_scale, "angle_scale", where=where, positive=True)
        self.dihedral_scale = check_number(dihedral_scale, "dihedral_scale", where=where, positive=True)
        self.levels = _levels(rows, anchor_t, n)
        self.rows, self.anchors, self.n_atoms = rows, anchor_t, n
        m = len(rows)
        self.event_shape = torch.Size([3 * n])
        self.latent_shape = torch.Size([3 * n - 6])
        self.circular_idx = [2 * m + 3 + k for k in circular_rows]
        self.domain = _AnchoredFrame(ref, anchor_t)
        self.codomain = Real()
        for name, column in (("atom_idx", 0), ("bond_idx", 1), ("angle_idx", 2), ("dihedral_idx", 3)):
            index = [row[0] if column == 0 else row[1][column - 1] for row in rows]
            self.register_buffer(name, torch.tensor(index, dtype=torch.long), persistent=False)
        is_circular = torch.zeros(m, dtype=torch.bool)
        is_circular[circular_rows] = True
        # Computed in float64, kept in the default dtype (they follow .to() like any buffer).
        dtype = torch.get_default_dtype()
        dihedral_scales = torch.where(is_circular, 1.0, self.dihedral_scale).to(torch.float64)
        scales = torch.cat([torch.full((m + 2,), self.bond_scale), torch.full((m + 1,), self.angle_scale)])
        scales = torch.cat([scales.double(), dihedral_scales])
        self._log_scale = float(scales.log().sum())
        self.register_buffer("reference", ref.to(dtype), persistent=False)
        self.register_buffer("ref_internal", self._raw(ref[None])[0][0].to(dtype), persistent=False)
        self.register_buffer("scales", scales.to(dtype), persistent=False)

    def _raw(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unnormalised internal coordinates `(bonds, angles, dihedrals)` concatenated, and the forward ladj."""
        pos = x.unflatten(-1, (self.n_atoms, 3))
        pi, pb, pa, pd = (pos[..., idx, :] for idx in (self.atom_idx, self.bond_idx, self.angle_idx, self.dihedral_idx))
        c0, c1, c2 = (pos[..., i, :] for i in self.anchors)
        r = (pi - pb).norm(dim=-1)
        theta = bond_angle(pi, pb, pa)
        phi = dihedral(pi, pb, pa, pd)
        r1, r2 = (c1 - c0).norm(dim=-1), (c2 - c0).norm(dim=-1)
        alpha = bond_angle(c1, c0, c2)
        q = torch.cat([r, r1[..., None], r2[..., None], theta, alpha[..., None], phi], dim=-1)
        ladj = -(2 * r.log() + theta.sin().log()).sum(-1) - r2.log()
        return q, ladj

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q, ladj = self._raw(x)
        m = len(self.rows)
        ref = self.ref_internal.to(q)
        delta = torch.cat([q[..., : 2 * m + 3] - ref[: 2 * m + 3], _wrap(q[..., 2 * m + 3 :] - ref[2 * m + 3 :])], -1)
        return delta / self.scales.to(q), ladj - self._log_scale

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        m = len(self.rows)
        q = z * self.scales.to(z) + self.ref_internal.to(z)
        r, (r1, r2), theta, alpha, phi = (
            q[..., :m],
            q[..., m : m + 2].unbind(-1),
            q[..., m + 2 : 2 * m + 2],
            q[..., 2 * m + 2],
            q[..., 2 * m + 3 :],
        )
        zero = torch.zeros_like(r1)
        pos: dict[int, Tensor] = {
            self.anchors[0]: torch.stack([zero, zero, zero], -1),
            self.anchors[1]: torch.stack([r1, zero, zero], -1),
            self.anchors[2]: torch.stack([r2 * torch.cos(alpha), r2 * torch.sin(alpha), zero], -1),
        }
        for level in self.levels:
            partners = [torch.stack([pos[self.rows[k][1][j]] for k in level], -2) for j in range(3)]
            new = _place(*partners, r[..., level], theta[..., level], phi[..., level])
            for k, p in zip(level, new.unbind(-2), strict=True):
                pos[self.rows[k][0]] = p
        x = torch.stack([pos[i] for i in range(self.n_atoms)], -2).flatten(-2)
        ladj = (2 * r.log() + theta.sin().log()).sum(-1) + r2.log() + self._log_scale
        return x, ladj

    def extra_repr(self) -> str:
        return f"atoms={self.n_atoms}, rows={len(self.rows)}, anchors={self.anchors}, circular={len(self.circular_idx)}"
