r"""The 2-D Yukawa model: a real scalar field coupled to two flavours of massless staggered fermions.

Integrating out the fermions leaves the scalar field with the effective action

$$
S(\phi) = S_B(\phi) - \log\det\big(D[\phi] D[\phi]^\dagger\big),
$$

$S_B$ the $\phi^4$ action of [`Phi4`][flowkit.targets.Phi4] and $D$ the staggered operator of
[`StaggeredDirac`][flowkit.lattice.StaggeredDirac]. Two forms:

- **exact**: $\log\det(D D^\dagger) = 2\log|\det D|$ by dense LU ([`YukawaStaggered`][flowkit.targets.YukawaStaggered]
  for $L \le 16$), with the analytic force $2g\,\operatorname{diag} D^{-1}$;
- **pseudofermions**: $\det(D D^\dagger) = \pi^{-V}\int d\chi^\dagger d\chi\, e^{-\chi^\dagger (D D^\dagger)^{-1}\chi}$
  with a complex $\chi$, stored as two real fields $\chi_1, \chi_2$ (as $D$ is real,
  $\chi^\dagger A^{-1}\chi = \chi_1^T A^{-1}\chi_1 + \chi_2^T A^{-1}\chi_2$). The action
  [`pseudofermion_action`][flowkit.targets.yukawa.YukawaStaggered.pseudofermion_action] solves $A X = \chi$ by
  conjugate gradient; its gradient is $\partial S_{pf}/\partial\phi_x = -2g\sum_f X_{f,x} (D^\dagger X_f)_x$,
  $\partial S_{pf}/\partial \chi_f = 2 X_f$. The joint density of $(\phi, \chi)$ is the target
  [`YukawaJoint`][flowkit.targets.YukawaJoint], whose $\phi$-marginal is exactly the Yukawa model.

References:
    Albergo, Kanwar, Racanière, Rezende, Urban, Boyda, Cranmer, Hackett & Shanahan, *Flow-based sampling for
    fermionic lattice field theories*, PRD 104, 114507 (2021) (arXiv:2106.05934);
    Abbott et al., *Gauge-equivariant flow models for sampling in lattice field theories with pseudofermions*,
    PRD 106, 074506 (2022) (arXiv:2207.08945);
    Weingarten & Petcher, *Monte Carlo integration for lattice gauge theories with fermions*, Phys. Lett. B 99 (1981).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .._validation import check_number
from ..lattice.fermions import StaggeredDirac, check_cg_tolerance, conjugate_gradient
from .base import Target
from .lattice import Phi4

__all__ = ["YukawaStaggered", "YukawaJoint", "EXACT_MAX_L"]

#: The largest lattice whose determinant [`YukawaStaggered`][flowkit.targets.YukawaStaggered] computes densely.
EXACT_MAX_L = 16


def _pseudofermion_force(dirac: StaggeredDirac, phi: Tensor, chi: Tensor, tol: float) -> tuple[Tensor, Tensor]:
    r"""$X_f = (D D^T)^{-1} \chi_f$ by CG and $-\partial_\phi S_{pf} = 2g \sum_f X_f (D^T X_f)$."""
    field = phi.unsqueeze(-3)
    X, _ = conjugate_gradient(lambda v: dirac.apply_normal(field, v), chi, tol=tol)
    return X, 2 * dirac.g * (X * dirac.apply_dagger(field, X)).sum(-3)


class _PseudofermionAction(torch.autograd.Function):
    r"""$\sum_f \chi_f^T (D D^T)^{-1} \chi_f$ by CG, with the analytic gradient (first order only)."""

    @staticmethod
    def forward(ctx: Any, phi: Tensor, chi: Tensor, dirac: StaggeredDirac, tol: float) -> Tensor:
        field = phi.unsqueeze(-3)
        X, _ = conjugate_gradient(lambda v: dirac.apply_normal(field, v), chi, tol=tol)
        ctx.save_for_backward(phi, X)
        ctx.dirac = dirac
        return (chi * X).sum((-1, -2, -3))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        phi, X = ctx.saved_tensors
        dirac = ctx.dirac
        g = grad[..., None, None]
        grad_phi = -2 * dirac.g * (X * dirac.apply_dagger(phi.unsqueeze(-3), X)).sum(-3) * g
        grad_chi = 2 * X * g[..., None]
        return grad_phi, grad_chi, None, None


class YukawaStaggered(Target):
    r"""Scalar $\phi^4$ theory with two flavours of staggered fermions, Yukawa coupling $g$; event shape `(L, L)`.

    The density of the scalar field is $p(\phi) \propto e^{-S_B(\phi)} \det(D[\phi] D[\phi]^\dagger)$, i.e.

    $$
    u(\phi) = \sum_x \Big[\sum_\mu (\phi_{x+\hat\mu} - \phi_x)^2 + m^2\phi_x^2 + \lambda\phi_x^4\Big]
      - \log\det\big(D[\phi] D[\phi]^\dagger\big),
    $$

    with $D$ the staggered operator of [`flowkit.lattice.fermions`][flowkit.lattice.fermions] (time, axis `-2`,
    antiperiodic). **Sign conventions.** $\det D$ is real but changes sign once $|g\phi|$ is of order one;
    following Albergo et al. (2021) the model has $N_f = 2$ degenerate flavours, with the weight
    $\det D^2 = \det(D D^\dagger) > 0$ (no sign problem). The scalar action is [`Phi4`][flowkit.targets.Phi4]'s.

    **Energy and force.** [`energy`][flowkit.targets.base.Target.energy] is exact (dense LU, differentiable)
    for `L <= 16`; larger lattices raise a `ValueError` there and use the pseudofermion forms
    ([`pseudofermion_action`][flowkit.targets.yukawa.YukawaStaggered.pseudofermion_action],
    [`sample_pseudofermions`][flowkit.targets.yukawa.YukawaStaggered.sample_pseudofermions],
    [`joint`][flowkit.targets.yukawa.YukawaStaggered.joint], [`pseudofermion_hmc`][flowkit.sampling.pseudofermion_hmc]).
    The force is analytic: $-\nabla u = -\nabla S_B + 2g\,\operatorname{diag}(D^{-1})$.

    Arguments:
        L: lattice extent, even.
        m2: scalar bare mass squared $m^2$.
        lam: quartic coupling $\lambda \ge 0$.
        g: Yukawa coupling (finite; `g = 0` is the free fermion, independent of $\phi$).
        boundary: fermion boundary conditions, `"antiperiodic-time"` (default) or `"periodic"`.
        mass: bare fermion mass $m_f$ (default 0: massless, as in the paper).
        cg_tol: relative residual of the conjugate-gradient solves of the pseudofermion forms, in `(0, 1)`;
            a solve that does not reach it raises [`ConvergenceError`][flowkit.root_finding.ConvergenceError].

    References:
        Albergo et al., PRD 104, 114507 (2021) (arXiv:2106.05934), Sec. V (the Yukawa model);
        Abbott et al., PRD 106, 074506 (2022) (arXiv:2207.08945) (pseudofermions).
    """

    def __init__(
        self,
        L: int = 8,
        m2: float = -4.0,
        lam: float = 8.0,
        g: float = 0.3,
        boundary: str = "antiperiodic-time",
        mass: float = 0.0,
        cg_tol: float = 1e-10,
    ) -> None:
        super().__init__()
        where = "YukawaStaggered"
        L = check_number(L, "L", where=where, integer=True, low=2)
        if L % 2:
            raise ValueError(f"{where}: L must be even (staggered fermions need even extents), got {L}")
        g = check_number(g, "g", where=where)
        check_number(m2, "m2", where=where)
        check_number(lam, "lam", where=where, low=0)
        self.cg_tol = check_cg_tolerance(cg_tol, "cg_tol", where)
        self.scalar = Phi4(L, m2, lam)  # checks m2 and lam
        self.dirac = StaggeredDirac(L, g, mass, boundary)
        if boundary == "periodic" and g == 0 and self.dirac.mass == 0:
            raise ValueError(
                f"{where}: with boundary='periodic', g = 0 and mass = 0 the Dirac operator has zero modes for every "
                "field (det D = 0), so the density vanishes everywhere; use boundary='antiperiodic-time', a mass or "
                "g != 0"
            )
        self.event_shape = torch.Size([L, L])
        self.L, self.m2, self.lam, self.g = int(L), float(m2), float(lam), float(g)
        self.mass, self.boundary = float(mass), boundary

    # --- the exact form

    def _check_exact(self, where: str) -> None:
        if self.L > EXACT_MAX_L:
            raise ValueError(
                f"YukawaStaggered.{where}: the exact determinant is dense, for L <= {EXACT_MAX_L}; got L = {self.L}. "
                "Use the pseudofermion forms (pseudofermion_action, joint, flowkit.sampling.pseudofermion_hmc)"
            )

    def bosonic_energy(self, x: Tensor) -> Tensor:
        r"""The scalar action $S_B(\phi)$ alone (batch shape)."""
        self._check(x, "bosonic_energy")
        return self.scalar._energy(x)

    def log_det(self, x: Tensor) -> Tensor:
        r"""$\log\det(D D^\dagger) = 2\log|\det D[\phi]|$ by dense LU, differentiable (batch shape); `L <= 16`."""
        self._check(x, "log_det")
        self._check_exact("log_det")
        return 2 * self.dirac.log_abs_det(x)

    def _energy(self, x: Tensor) -> Tensor:
        self._check_exact("energy")
        return self.scalar._energy(x) - 2 * self.dirac.log_abs_det(x)

    def _force(self, x: Tensor) -> Tensor:
        self._check_exact("force")
        y = x.detach().to(torch.promote_types(x.dtype, torch.float64))
        inverse = self.dirac.inverse(y, "YukawaStaggered.force")
        inverse_diagonal = inverse.diagonal(dim1=-2, dim2=-1).unflatten(-1, (self.L, self.L))
        return (self.scalar._force(y) + 2 * self.g * inverse_diagonal).to(x.dtype)

    # --- pseudofermions

    def sample_pseudofermions(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        r"""Heat-bath pseudofermions $\chi = D[\phi]\eta$, $\eta$ complex with density $\propto e^{-\eta^\dagger\eta}$.

        Returns the two real parts `(..., 2, L, L)` of $\chi$; given $\phi$ they have the density
        $\propto e^{-\chi^\dagger (D D^\dagger)^{-1}\chi}$, and
        [`pseudofermion_action`][flowkit.targets.yukawa.YukawaStaggered.pseudofermion_action] at them is
        $\eta^\dagger\eta$.
        """
        self._check(x, "sample_pseudofermions")
        eta = torch.randn(*x.shape[:-2], 2, self.L, self.L, generator=generator, dtype=x.dtype, device=x.device)
        return self.dirac.apply(x.unsqueeze(-3), eta * math.sqrt(0.5))

    def _check_chi(self, x: Tensor, chi: Tensor, where: str) -> None:
        self._check(x, where)
        if not isinstance(chi, Tensor) or chi.shape[-3:] != (2, self.L, self.L) or chi.shape[:-3] != x.shape[:-2]:
            raise ValueError(
                f"YukawaStaggered.{where}: chi must be (..., 2, {self.L}, {self.L}) with the batch shape of x "
                f"{tuple(x.shape[:-2])}, got {tuple(chi.shape) if isinstance(chi, Tensor) else type(chi).__name__}"
            )

    def pseudofermion_action(self, x: Tensor, chi: Tensor) -> Tensor:
        r"""$S_{pf}(\phi, \chi) = \sum_{f=1,2}\chi_f^T (D D^\dagger)^{-1}\chi_f$ by conjugate gradient (batch shape).

        Differentiable in `x` and `chi` (first order) through the CG solution $X_f = (D D^\dagger)^{-1}\chi_f$:
        $\partial_{\phi_x} S_{pf} = -2g\sum_f X_{f,x}(D^\dagger X_f)_x$. The solves stop at the relative
        residual `cg_tol`, so $S_{pf}$ and its gradient carry a relative error of that order.

        Arguments:
            x: scalar fields `(..., L, L)`.
            chi: pseudofermions `(..., 2, L, L)` (the real and imaginary parts).
        """
        self._check_chi(x, chi, "pseudofermion_action")
        return _PseudofermionAction.apply(x, chi, self.dirac, self.cg_tol)

    def pseudofermion_potential(self, x: Tensor, chi: Tensor) -> tuple[Tensor, Tensor]:
        r"""$(S_B + S_{pf},\ \nabla_\phi(S_B + S_{pf}))$ at fixed $\chi$, without graphs: the HMC potential."""
        self._check_chi(x, chi, "pseudofermion_potential")
        phi = x.detach()
        X, force = _pseudofermion_force(self.dirac, phi, chi, self.cg_tol)
        return self.scalar._energy(phi) + (chi * X).sum((-1, -2, -3)), -self.scalar._force(phi) - force

    def joint(self) -> YukawaJoint:
        r"""The joint target of $(\phi, \chi)$ (see [`YukawaJoint`][flowkit.targets.YukawaJoint])."""
        return YukawaJoint(self.L, self.m2, self.lam, self.g, self.boundary, self.mass, self.cg_tol)

    def extra_repr(self) -> str:
        return f"L={self.L}, m2={self.m2}, lam={self.lam}, g={self.g}, boundary={self.boundary!r}, mass={self.mass}"


class YukawaJoint(Target):
    r"""The Yukawa model with its pseudofermions: the density of $(\phi, \chi_1, \chi_2)$, event shape `(3, L, L)`.

    $$u(\phi, \chi) = S_B(\phi) + \sum_{f=1,2}\chi_f^T \big(D[\phi] D[\phi]^\dagger\big)^{-1}\chi_f$$

    (channel 0 is $\phi$, channels 1 and 2 the real and imaginary parts of $\chi$). Integrating $\chi$ out
    gives $\pi^V \det(D D^\dagger)\, e^{-S_B}$, so the $\phi$-marginal is exactly
    [`YukawaStaggered`][flowkit.targets.YukawaStaggered]'s, at any `L` (conjugate gradient to `cg_tol`).

    Arguments: as [`YukawaStaggered`][flowkit.targets.YukawaStaggered].
    """

    def __init__(
        self,
        L: int = 8,
        m2: float = -4.0,
        lam: float = 8.0,
        g: float = 0.3,
        boundary: str = "antiperiodic-time",
        mass: float = 0.0,
        cg_tol: float = 1e-10,
    ) -> None:
        super().__init__()
        self.model = YukawaStaggered(L, m2, lam, g, boundary, mass, cg_tol)
        self.L = self.model.L
        self.event_shape = torch.Size([3, self.L, self.L])

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """`(phi, chi)`: the scalar field `(..., L, L)` and the pseudofermions `(..., 2, L, L)` of joint states."""
        return x[..., 0, :, :], x[..., 1:, :, :]

    def _energy(self, x: Tensor) -> Tensor:
        phi, chi = self.split(x)
        action = _PseudofermionAction.apply(phi, chi, self.model.dirac, self.model.cg_tol)
        return self.model.scalar._energy(phi) + action

    def _force(self, x: Tensor) -> Tensor:
        phi, chi = self.split(x.detach())
        X, force = _pseudofermion_force(self.model.dirac, phi, chi, self.model.cg_tol)
        return torch.cat([(self.model.scalar._force(phi) + force).unsqueeze(-3), -2 * X], -3)

    def extra_repr(self) -> str:
        return self.model.extra_repr()
