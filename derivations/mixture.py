r"""Gaussian mixtures: the per-component Gaussian integral and tilted mean, with SymPy.

Against a mixture :math:`\sum_k w_k\mathcal N(\alpha_k,\Sigma_k)` the attention field of a
score quadratic in the key token,
:math:`s(x,y) = -\tfrac12 y^THy + y^Th(x) + r(x)` with :math:`h(x) = Ax + g`, is

.. math:: \Gamma(x) = V\,\frac{\sum_k w_kZ_k(x)\,m_k(x)}{\sum_k w_kZ_k(x)},

so each component needs, besides the tilted mean :math:`m_k` that
:func:`derivations._symbolic.quadratic_score_field` derives for one Gaussian, the Gaussian
integral :math:`Z_k(x) = \mathbb E_{y\sim\mathcal N(\alpha_k,\Sigma_k)}[e^{s(x,y)}]`.
Completing the square (:math:`P = I + \Sigma H`, stationarity
:math:`\Sigma^{-1}(m - \alpha) = h - Hm` removes every :math:`\Sigma^{-1}`):

.. math::

    \log Z(x) = r(x) - \tfrac12\log\det(I + \Sigma H) + \tfrac12(m + \alpha)^Th(x)
                - \tfrac12\alpha^THm,\qquad m = (I + \Sigma H)^{-1}(\alpha + \Sigma h(x)).

This script derives :math:`H, A, g, r` from the SymPy scores of ``softmax.py`` and
``l2.py`` (reusing their single-Gaussian derivation for :math:`m`), builds
:math:`\log Z`, and checks both against direct symbolic integration of
:math:`e^{s}\mathcal N(y;\alpha,\Sigma)`: in ``d = 1`` with symbols, in ``d = 2`` with
explicit weights (singular :math:`A`, correlated :math:`\Sigma`). The vectorised code in
``gaussian_pde/closure/_mixture.py`` is tested against :func:`log_partition` in
``tests/closure/test_mixture.py``. Run ``python derivations/mixture.py``.
"""

from __future__ import annotations

import dataclasses

import sympy as sp

try:
    from . import _symbolic as S
    from . import l2, softmax
except ImportError:  # run as a script
    import _symbolic as S
    import l2
    import softmax

SCORES = {"softmax": softmax.SCORE, "l2": l2.SCORE}


@dataclasses.dataclass(frozen=True)
class MixtureTerms:
    r"""Per-component terms of a quadratic score.

    :math:`\log Z = r - \tfrac12\log\det P + q` with ``remainder`` :math:`r(x)` (1 x 1,
    common to all components), ``P`` :math:`= I + \Sigma H`, ``quadratic``
    :math:`q = \tfrac12(m+\alpha)^Th - \tfrac12\alpha^THm` (1 x 1) and ``tilted_mean`` :math:`m`.
    """

    remainder: sp.MatrixExpr
    P: sp.MatrixExpr
    quadratic: sp.MatrixExpr
    tilted_mean: sp.MatrixExpr
    parts: S.QuadraticScore

    @property
    def log_Z(self):
        r"""A printable form of :math:`\log Z`."""
        return f"{self.remainder} - log(det({self.P}))/2 + {self.quadratic}"


def log_partition(score):
    r""":math:`\log Z(x)` and :math:`m(x)` of a score quadratic in ``y`` against :math:`\mathcal N(\alpha,\Sigma)`.

    ``r(x)`` is the score at ``y = 0``; ``H``, ``A``, ``g`` come from
    :func:`derivations._symbolic.decompose_quadratic_score`, the tilted mean from
    :func:`derivations._symbolic.quadratic_score_field` (its completing-the-square checks
    run there).
    """
    field = S.quadratic_score_field(score)
    parts = field.parts
    m = field.tilted_mean
    h = parts.A * S.x + parts.g
    r = sp.expand(score.subs(S.y, S.zero_vec)).doit()
    P = S.I + S.Sigma * parts.H
    quad = (sp.Rational(1, 2) * (m + S.alpha).T * h
            - sp.Rational(1, 2) * S.alpha.T * parts.H * m)
    return MixtureTerms(remainder=r, P=P, quadratic=quad, tilted_mean=m, parts=parts)


def _scalar(expr):
    expr = sp.sympify(expr)
    if hasattr(expr, "shape") and tuple(expr.shape) == (1, 1):
        return expr[0, 0]
    return expr


def evaluate(terms, subs, point):
    """``(log Z, m)`` for explicit matrices ``subs`` and an explicit token ``point``."""
    dim = subs[S.Sigma].shape[0]
    kq = subs[S.Q].shape[0]
    point = sp.Matrix(point)
    full = {**subs, S.x: point}

    def ex(e):
        return S.explicit(e.subs({S.d: dim, S.k: kq}), full)

    logdet = sp.log(ex(terms.P).det())
    r = _scalar(ex(terms.remainder)) if terms.remainder != 0 else 0
    val = r - logdet / 2 + _scalar(ex(terms.quadratic))
    m = ex(terms.tilted_mean)
    return sp.simplify(val), sp.simplify(m)


def _direct(score, subs, point):
    r"""``(log Z, m)`` by integrating :math:`e^{s}\mathcal N(y;\alpha,\Sigma)` coordinate by coordinate."""
    dim = subs[S.Sigma].shape[0]
    ys = sp.Matrix(sp.symbols(f"y1:{dim + 1}", real=True))
    Sig, al = subs[S.Sigma], subs[S.alpha]
    dens = (sp.exp(-((ys - al).T * Sig.inv() * (ys - al))[0, 0] / 2)
            / sp.sqrt((2 * sp.pi) ** dim * Sig.det()))
    s = S.explicit(score, {**subs, S.x: sp.Matrix(point), S.y: ys})[0, 0]
    f = sp.exp(sp.expand(s)) * dens

    def integrate_all(g):
        for yi in ys:
            g = sp.integrate(g, (yi, -sp.oo, sp.oo), conds="none")
        return g

    Z = integrate_all(f)
    m = sp.Matrix([integrate_all(yi * f) / Z for yi in ys])
    return Z, sp.simplify(m)


def check(score, subs, points):
    """Derived ``log Z`` and ``m`` agree with direct integration at every point."""
    terms = log_partition(score)
    for p in points:
        logz, m = evaluate(terms, subs, p)
        Z, m_direct = _direct(score, subs, p)
        if (sp.simplify(sp.expand_log(sp.log(Z) - logz, force=True)) != 0
                and sp.simplify(Z - sp.exp(logz)) != 0):
            # explicit inputs: SymPy may leave equal closed forms apart; 60 digits decide
            free = (Z - sp.exp(logz)).free_symbols
            if free or abs(sp.N(sp.log(Z) - logz, 60)) > 1e-50:
                return False
        if not sp.simplify(m - m_direct).is_zero_matrix:
            return False
    return True


def _subs_1d():
    q, kk, v, a, xx = sp.symbols("q k_1 v a x_0", real=True)
    c, sig = sp.symbols("c sigma", positive=True)
    subs = {S.Q: sp.Matrix([[q]]), S.K: sp.Matrix([[kk]]), S.V: sp.Matrix([[v]]),
            S.alpha: sp.Matrix([a]), S.Sigma: sp.Matrix([[sig**2]]), S.scale: c}
    return subs, [[xx]]


def subs_2d():
    """Explicit ``d = 2`` weights used by the checks (``k = 1``: singular interaction)."""
    R = sp.Rational
    subs = {S.Q: sp.Matrix([[1, R(1, 2)]]), S.K: sp.Matrix([[R(-1, 3), 1]]),
            S.V: sp.Matrix([[1, R(1, 4)], [0, 2]]), S.alpha: sp.Matrix([R(1, 2), -1]),
            S.Sigma: sp.Matrix([[2, R(1, 2)], [R(1, 2), 1]]), S.scale: R(1, 2)}
    return subs, [[0, 0], [1, 0], [R(-1, 2), 2]]


CHECKS = {}
for _name, _score in SCORES.items():
    CHECKS[f"{_name}: log Z and m by direct integration, d = 1"] = (
        lambda sc=_score: check(sc, *_subs_1d()))
    CHECKS[f"{_name}: log Z and m by direct integration, d = 2"] = (
        lambda sc=_score: check(sc, *subs_2d()))


if __name__ == "__main__":
    print("Gaussian mixtures: per-component log Z and tilted mean")
    for name, score in SCORES.items():
        t = log_partition(score)
        print(f"  {name}: log Z =", t.log_Z)
        print(f"  {name}: m =", t.tilted_mean)
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
