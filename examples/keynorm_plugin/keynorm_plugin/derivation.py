r"""SymPy derivation of the moment equations of key-norm softmax attention.

The score of a key-norm softmax head penalises the norm of the key token,

.. math:: s(x, y) = c\,(Qx)^T(Ky) - \tfrac{\gamma}{2}|y|^2
                  = y^TAx - \tfrac12 y^T(\gamma I)y,\qquad A = cK^TQ,\ \gamma \ge 0,

and its velocity is :math:`\Gamma[\mu](x) = V\int e^{s(x,y)}y\,d\mu(y) / \int e^{s(x,y)}d\mu(y)`.
Against :math:`\mu = \mathcal N(\alpha, \Sigma)` the log-density of the tilted measure
:math:`e^{s(x,\cdot)}\mu` is quadratic in :math:`y` with Hessian
:math:`-(\Sigma^{-1} + \gamma I)`: the tilted measure is Gaussian, with mean

.. math:: m(x) = (\Sigma^{-1} + \gamma I)^{-1}(\Sigma^{-1}\alpha + Ax)
               = (I + \gamma\Sigma)^{-1}(\alpha + \Sigma Ax),

so the field is affine, :math:`\Gamma(x) = Mx + b` with

.. math:: M = V(I + \gamma\Sigma)^{-1}\Sigma A,\qquad b = V(I + \gamma\Sigma)^{-1}\alpha,

and a Gaussian stays Gaussian with :math:`\alpha' = M\alpha + b`,
:math:`\Sigma' = M\Sigma + \Sigma M^T` (and :math:`L' = ML` for :math:`\Sigma = LL^T`).
In factor form, by the push-through identity,
:math:`(I + \gamma\Sigma)^{-1}\Sigma = L(I + \gamma L^TL)^{-1}L^T`, which is what the
compiled kernel evaluates (one Cholesky solve with :math:`I + \gamma L^TL`, no inverse of
:math:`\Sigma`, valid for singular covariances).

:func:`derive` obtains :math:`M` and :math:`b` for ``d = 2`` from the stationary point of
the tilted log-density (no formula assumed) and :data:`CHECKS` tests them independently:
a direct symbolic integration for ``d = 1``, a Gauss-Hermite quadrature of the definition
for ``d = 2`` and ``3`` at rational weights, ``gamma = 0`` against softmax, the moment
equations from the weak form of the continuity equation, and the factor form. Run it as
``python -m keynorm_plugin.derivation``.
"""

from __future__ import annotations

import itertools

import numpy as np
import sympy as sp

__all__ = ["derive", "closed_form", "CHECKS", "run_checks"]

gamma = sp.Symbol("gamma", nonnegative=True)


def _sym(name, r, c):
    return sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{name}{i + 1}{j + 1}", real=True))


def _spd(d):
    """A symmetric ``d x d`` matrix of symbols (the covariance)."""
    return sp.Matrix(d, d, lambda i, j: sp.Symbol(f"s{min(i, j) + 1}{max(i, j) + 1}", real=True))


def closed_form(Sigma, alpha, A, V, g=gamma):
    r"""The stated result.

    :math:`M = V(I + \gamma\Sigma)^{-1}\Sigma A`, :math:`b = V(I + \gamma\Sigma)^{-1}\alpha`.
    """
    d = Sigma.shape[0]
    P = (sp.eye(d) + g * Sigma).inv()
    return V * P * Sigma * A, V * P * alpha


def derive(d=2):
    r"""``(M, b)`` from the stationary point of the tilted log-density, for dimension ``d``.

    :math:`\varphi(y) = -\tfrac12(y - \alpha)^T\Sigma^{-1}(y - \alpha) + y^TAx -
    \tfrac{\gamma}{2}|y|^2`; its Hessian is constant (a Gaussian), its stationary point
    is the tilted mean :math:`m(x)`, and :math:`M = \partial(Vm)/\partial x`,
    :math:`b = Vm(0)`.
    """
    Sigma, A, V = _spd(d), _sym("a", d, d), _sym("v", d, d)
    alpha, x, y = _sym("alpha", d, 1), _sym("x", d, 1), _sym("y", d, 1)
    Sinv = Sigma.inv()
    phi = (-(y - alpha).T * Sinv * (y - alpha) / 2 + y.T * A * x - gamma * (y.T * y) / 2)[0, 0]
    grad = sp.Matrix([phi.diff(v) for v in y])
    hessian = grad.jacobian(y)
    if (hessian + Sinv + gamma * sp.eye(d)).applyfunc(sp.simplify) != sp.zeros(d, d):
        raise ArithmeticError("the tilted log-density is not quadratic in y")
    solution = sp.solve(list(grad), list(y), dict=True)[0]
    velocity = V * sp.Matrix([solution[v] for v in y])
    M = velocity.jacobian(x)
    if any(set(x) & e.free_symbols for e in M):
        raise ArithmeticError("the field is not affine in x")
    b = velocity.subs({xi: 0 for xi in x})
    return dict(Sigma=Sigma, A=A, V=V, alpha=alpha, M=M.applyfunc(sp.simplify),
                b=b.applyfunc(sp.simplify))


# ----------------------------------------------------------------------------------------
# independent checks
# ----------------------------------------------------------------------------------------

def check_derivation_matches_closed_form():
    """The stationary-point derivation (d = 2) equals the stated closed form."""
    r = derive(2)
    M, b = closed_form(r["Sigma"], r["alpha"], r["A"], r["V"])
    assert (r["M"] - M).applyfunc(sp.simplify) == sp.zeros(2, 2)
    assert (r["b"] - b).applyfunc(sp.simplify) == sp.zeros(2, 1)


def check_d1_direct_integration():
    """D = 1: the definition integrated symbolically (no completion of the square)."""
    y, x, a = sp.symbols("y x a", real=True)
    alpha, v = sp.symbols("alpha v", real=True)
    s = sp.Symbol("s", positive=True)
    g = sp.Symbol("g", positive=True)
    weight = sp.exp(-(y - alpha) ** 2 / (2 * s) + a * x * y - g * y ** 2 / 2)
    num = sp.integrate(y * weight, (y, -sp.oo, sp.oo), conds="none")
    den = sp.integrate(weight, (y, -sp.oo, sp.oo), conds="none")
    field = sp.simplify(v * num / den)
    M, b = closed_form(sp.Matrix([[s]]), sp.Matrix([[alpha]]), sp.Matrix([[a]]),
                       sp.Matrix([[v]]), g)
    assert sp.simplify(field - (M[0, 0] * x + b[0, 0])) == 0


def _rational_setting(d, seed):
    rng = np.random.default_rng(seed)
    frac = lambda: sp.Rational(int(rng.integers(-6, 7)), 8)     # noqa: E731
    A = sp.Matrix(d, d, lambda i, j: frac())
    V = sp.Matrix(d, d, lambda i, j: frac())
    L = sp.Matrix(d, d, lambda i, j: (sp.Rational(1, 2) + sp.Rational(int(rng.integers(0, 4)), 8))
                  if i == j else (frac() if i > j else 0))
    alpha = sp.Matrix(d, 1, lambda i, j: frac())
    x = sp.Matrix(d, 1, lambda i, j: frac())
    return A, V, L * L.T, alpha, x, sp.Rational(3, 4)


def _quadrature_field(A, V, Sigma, alpha, x, g, n=40):
    """The definition by a tensor Gauss-Hermite rule in the whitened variable."""
    f = lambda m: np.array(m.evalf(30).tolist(), dtype=float)    # noqa: E731
    A, V, Sigma, alpha, x = map(f, (A, V, Sigma, alpha, x))
    alpha, x = alpha[:, 0], x[:, 0]
    d = len(alpha)
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    C = np.linalg.cholesky(Sigma)
    Y, logw = [], []
    for idx in itertools.product(range(n), repeat=d):
        z = nodes[list(idx)]
        Y.append(alpha + C @ z)
        logw.append(np.log(weights[list(idx)]).sum())
    Y, logw = np.array(Y), np.array(logw)
    score = Y @ (A @ x) - float(g) / 2 * np.sum(Y * Y, axis=1) + logw
    w = np.exp(score - score.max())
    return V @ (w @ Y / w.sum())


def check_quadrature_d2_d3():
    """D = 2, 3 at rational weights: the closed form against a quadrature of the definition."""
    for d, seed in ((2, 0), (2, 1), (3, 2)):
        A, V, Sigma, alpha, x, g = _rational_setting(d, seed)
        M, b = closed_form(Sigma, alpha, A, V, g)
        exact = np.array((M * x + b).evalf(30).tolist(), dtype=float)[:, 0]
        quad = _quadrature_field(A, V, Sigma, alpha, x, g, n=40 if d == 2 else 24)
        assert np.allclose(quad, exact, rtol=1e-10, atol=1e-12), (d, quad, exact)


def check_gamma_zero_is_softmax():
    r""":math:`\gamma = 0`: softmax's :math:`M = V\Sigma A`, :math:`b = V\alpha`."""
    Sigma, A, V, alpha = _spd(3), _sym("a", 3, 3), _sym("v", 3, 3), _sym("alpha", 3, 1)
    M, b = closed_form(Sigma, alpha, A, V, 0)
    assert (M - V * Sigma * A).applyfunc(sp.expand) == sp.zeros(3, 3)
    assert b == V * alpha


def check_moment_equations():
    r"""The weak form of the continuity equation gives the moment equations.

    :math:`\alpha' = M\alpha + b`, :math:`\Sigma' = M\Sigma + \Sigma M^T`.

    For an affine velocity :math:`v = Mx + b`, :math:`\tfrac{d}{dt}E[f] = E[\nabla f\cdot v]`:
    with :math:`f = x_i` and :math:`f = x_ix_j` and the Gaussian's moments
    :math:`E[x] = \alpha`, :math:`E[xx^T] = \Sigma + \alpha\alpha^T`.
    """
    d = 2
    Sigma, M, alpha, b = _spd(d), _sym("m", d, d), _sym("alpha", d, 1), _sym("b", d, 1)
    second = Sigma + alpha * alpha.T
    dmean = M * alpha + b                              # E[v]
    dsecond = M * second + b * alpha.T                 # E[v x^T]
    dsecond = dsecond + dsecond.T                      # E[v x^T + x v^T]
    dcov = dsecond - dmean * alpha.T - alpha * dmean.T
    assert (dcov - (M * Sigma + Sigma * M.T)).applyfunc(sp.expand) == sp.zeros(d, d)


def check_factor_form():
    r"""The factor form.

    Push-through: :math:`(I + \gamma LL^T)^{-1}LL^T = L(I + \gamma L^TL)^{-1}L^T`;
    :math:`L' = ML` gives :math:`\Sigma'`.
    """
    d = 2
    L = sp.Matrix(d, d, lambda i, j: sp.Symbol(f"l{i + 1}{j + 1}", real=True))
    Sigma = L * L.T
    lhs = (sp.eye(d) + gamma * Sigma).inv() * Sigma
    rhs = L * (sp.eye(d) + gamma * L.T * L).inv() * L.T
    assert (lhs - rhs).applyfunc(sp.simplify) == sp.zeros(d, d)
    M = _sym("m", d, d)
    dL = M * L
    assert (dL * L.T + L * dL.T - (M * Sigma + Sigma * M.T)).applyfunc(sp.expand) == sp.zeros(d, d)


#: name -> check (each raises AssertionError on failure)
CHECKS = {
    "the stationary point gives the closed form (d = 2)": check_derivation_matches_closed_form,
    "d = 1: direct symbolic integration of the definition": check_d1_direct_integration,
    "d = 2, 3: Gauss-Hermite quadrature of the definition": check_quadrature_d2_d3,
    "gamma = 0 is softmax": check_gamma_zero_is_softmax,
    "moment equations from the continuity equation": check_moment_equations,
    "factor form and the push-through identity": check_factor_form,
}


def run_checks():
    """Run every check of :data:`CHECKS`; returns the names that passed."""
    for check in CHECKS.values():
        check()
    return list(CHECKS)


def main():
    r = derive(2)
    print("Key-norm softmax attention, s(x, y) = c (Qx)^T(Ky) - gamma |y|^2 / 2, A = c K^T Q")
    print("M = V (I + gamma Sigma)^{-1} Sigma A,   b = V (I + gamma Sigma)^{-1} alpha")
    print("d = 2, derived: M[0, 0] =", sp.factor(r["M"][0, 0]))
    for name in run_checks():
        print(f"ok  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
