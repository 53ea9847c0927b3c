"""The order conditions of the DOP853 and RODAS4P2 tableaux, so that a mistyped digit fails.

A Runge-Kutta method with couplings ``A`` and weights ``b`` has order ``p`` when
``b . Phi(t) = 1/gamma(t)`` for every rooted tree ``t`` of at most ``p`` vertices
(Butcher; Hairer, Norsett and Wanner, Solving ODEs I, section II.2): ``Phi(t)`` is the
elementary weight (a product, over the children of each vertex, of ``A`` applied to the
child's weight) and ``gamma(t)`` the tree's density. A continuous extension of order ``p``
has weights ``b(theta)`` with ``b(theta) . Phi(t) = theta^|t| / gamma(t)``. A Rosenbrock
method in the classical form (Hairer and Wanner, Solving ODEs II, section IV.7) has the
same conditions with ``alpha`` at vertices of two or more children and ``alpha + Gamma`` at
vertices of one child (the Jacobian is linear).
"""

import dataclasses
import functools

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

import gaussian_pde as gp
from gaussian_pde._common.tableaux import DOP853, RODAS4P2
from gaussian_pde.integrate._options import METHODS

#: the residuals of the exact conditions are a few ulps (seen: below 2e-15)
TOL = 1e-13
THETAS = (0.1, 0.3, 0.5, 0.7, 0.9)


def _canonical(tree):
    return tuple(sorted(_canonical(c) for c in tree))


@functools.lru_cache(None)
def trees(n):
    """The rooted trees of ``n`` vertices, each a sorted tuple of its children's trees."""
    if n == 1:
        return ((),)

    def grafts(t):            # every tree made by adding one leaf to ``t``
        yield t + ((),)
        for i, c in enumerate(t):
            for g in grafts(c):
                yield t[:i] + (g,) + t[i + 1:]

    return tuple(sorted({_canonical(g) for t in trees(n - 1) for g in grafts(t)}))


def order(t):
    return 1 + sum(order(c) for c in t)


def density(t):
    return order(t) * int(np.prod([density(c) for c in t]))


def weights(multi, single=None, n_max=8):
    """``(Phi, sizes, densities)``: the elementary weights (one row per tree of at most
    ``n_max`` vertices, one column per stage), the trees' sizes and densities."""
    single = multi if single is None else single
    return _weights(multi.tobytes(), single.tobytes(), multi.shape[0], n_max)


@functools.lru_cache(64)
def _weights(multi, single, s, n_max):
    multi, single = (np.frombuffer(m).reshape(s, s) for m in (multi, single))
    phi = {}
    for n in range(1, n_max + 1):
        for t in trees(n):
            w = np.ones(multi.shape[0])
            for c in t:
                w = w * ((single if len(t) == 1 else multi) @ phi[c])
            phi[t] = w
    return (np.array(list(phi.values())), np.array([order(t) for t in phi]),
            np.array([density(t) for t in phi], dtype=float))


def defect(b, n, phi, theta=1.0):
    """The largest residual of the order conditions of the trees of ``n`` vertices
    (``n`` a number or a range)."""
    Phi, sizes, dens = phi
    rows = np.isin(sizes, np.atleast_1d(n))
    return np.abs(Phi[rows] @ b - theta ** sizes[rows] / dens[rows]).max()


def test_tree_counts():
    # rooted trees with n vertices: OEIS A000081 (1, 1, 2, 4, 9, 20, 48, 115)
    assert [len(trees(n)) for n in range(1, 9)] == [1, 1, 2, 4, 9, 20, 48, 115]
    assert sorted(density(t) for t in trees(3)) == [3, 6]    # [., .] and [[.]]: 1/3, 1/6


# ------------------------------------------------------------------------- DOP853
def _dop_defects(tab):
    """Largest residuals: ``(row sums, order 8, embedded 5, embedded 3, dense 7)``."""
    ns, A = tab.N_STAGES, tab.A
    A12, A13 = A[:ns, :ns], A[:ns + 1, :ns + 1]
    b13 = np.r_[tab.B, 0.0]
    rows = abs(A.sum(axis=1) - tab.C).max()
    phi12, phi13, phi = weights(A12), weights(A13, n_max=5), weights(A, n_max=7)
    main = defect(tab.B, range(1, 9), phi12)
    e5 = defect(b13 - tab.E5, range(1, 6), phi13)
    e3 = defect(b13 - tab.E3, range(1, 4), phi13)
    dense = max(defect(_dop_dense(tab, x), range(1, 8), phi, theta=x) for x in THETAS)
    return rows, main, e5, e3, dense


def _dop_dense(tab, x):
    """Weights ``b(x)`` of the continuous extension over the extended stages (the docstring
    of :class:`~gaussian_pde._common.tableaux.ExplicitPair`)."""
    ne, ns = tab.N_STAGES_EXTENDED, tab.N_STAGES
    eye = np.eye(ne)
    b = np.zeros(ne)
    b[:ns] = tab.B
    coeffs = [b, eye[0] - b, 2 * b - eye[ns] - eye[0], *tab.D]
    out = np.zeros(ne)
    for i, f in enumerate(coeffs[::-1]):
        out = (out + f) * (x if i % 2 == 0 else 1 - x)
    return out


def test_dop853_order_conditions():
    rows, main, e5, e3, dense = _dop_defects(DOP853)
    assert max(rows, main, e5, e3, dense) < TOL
    assert DOP853.A[DOP853.N_STAGES, :DOP853.N_STAGES] @ np.ones(12) == pytest.approx(1)
    # order exactly 8, 5 and 3: the next conditions fail by far more than rounding
    ns = DOP853.N_STAGES
    A13 = DOP853.A[:ns + 1, :ns + 1]
    b13 = np.r_[DOP853.B, 0.0]
    assert defect(DOP853.B, 9, weights(DOP853.A[:ns, :ns], n_max=9)) > 1e-6
    assert defect(b13 - DOP853.E5, 6, weights(A13, n_max=6)) > 1e-6
    assert defect(b13 - DOP853.E3, 4, weights(A13, n_max=4)) > 1e-6


def test_dop853_is_scipys():
    """The same floating-point numbers as the solver that SciPy ships: one step of
    :class:`scipy.integrate.DOP853` and one step written from our tableau agree bit for bit."""
    def f(t, y):
        return np.array([y[1], -np.sin(y[0]) + 0.1 * t])

    y0, h = np.array([1.0, 0.25]), 0.125
    ref = scipy.integrate.DOP853(f, 0.0, y0, 1.0, first_step=h, rtol=1e-3, atol=1e-6)
    ref.step()
    ns, A, C = DOP853.N_STAGES, DOP853.A, DOP853.C
    K = np.empty((ns + 1, 2))
    K[0] = f(0.0, y0)
    for s in range(1, ns):
        K[s] = f(C[s] * h, y0 + np.dot(K[:s].T, A[s, :s]) * h)
    y1 = y0 + h * np.dot(K[:-1].T, DOP853.B)
    assert ref.t == h and np.array_equal(ref.y, y1)


# ----------------------------------------------------------------------- RODAS4P2
def _classical(tab):
    """``(alpha, alpha + Gamma, b Gamma, Gamma)`` of a Hairer-Wanner form tableau."""
    s = len(tab.b)
    G = scipy.linalg.solve_triangular(np.eye(s) / tab.gamma - tab.c, np.eye(s), lower=True)
    alpha = tab.a @ G
    return alpha, alpha + G, tab.b @ G, G


def _rodas_defects(tab):
    """Largest residuals: ``(order 4, embedded 3, dense 3)``."""
    alpha, beta, b, G = _classical(tab)
    s = len(tab.b)
    phi = weights(alpha, beta, n_max=4)
    main = defect(b, range(1, 5), phi)
    emb = defect((tab.b - np.eye(s)[-1]) @ G, range(1, 4), phi)

    def dense_weights(x):   # y(x) - y0 = x (y1 - y0) + x (1 - x) (h_0 + x h_1) U
        return (x * tab.b + x * (1 - x) * (tab.h[0] + x * tab.h[1])) @ G

    dense = max(defect(dense_weights(x), range(1, 4), phi, theta=x) for x in THETAS)
    return main, emb, dense


def test_rodas_order_conditions():
    """Order 4 (embedded 3, dense output 3), stiffly accurate, L-stable: Steinebach's RODAS4P2."""
    tab = RODAS4P2
    assert max(_rodas_defects(tab)) < TOL
    alpha, beta, b, G = _classical(tab)
    assert np.allclose(np.diag(G), tab.gamma, rtol=0, atol=1e-15) and np.all(np.triu(G, 1) == 0)
    assert defect(b, 5, weights(alpha, beta, n_max=5)) > 1e-6                       # order exactly 4
    # stiffly accurate (the last stage is the step) and R(infinity) = 1 - b beta^-1 1 = 0
    assert np.array_equal(tab.b[:-1], tab.a[-1, :-1]) and tab.b[-1] == 1
    assert abs(1 - b @ np.linalg.solve(beta, np.ones(len(b)))) < TOL


def test_the_compiled_engine_reads_rodas4p2():
    from gaussian_pde.integrate import _steppers

    for name in ("a", "b", "c", "h"):
        assert np.array_equal(getattr(_steppers, f"_R{name.upper()}_"), getattr(RODAS4P2, name))
    assert _steppers._RGAMMA == RODAS4P2.gamma


# ------------------------------------------------------------------------ typos fail
def _typos(tab, names):
    """Copies of ``tab`` with one nonzero entry changed in its 8th significant digit."""
    for name in names:
        arr = getattr(tab, name)
        for idx in zip(*np.nonzero(arr)):
            bad = arr.copy()
            bad[idx] *= 1 + 1e-7
            fields = {name: bad}
            if name == "A" and idx[0] == tab.N_STAGES:   # B is A's row of stage f(y_1)
                fields["B"] = bad[tab.N_STAGES, :tab.N_STAGES]
            yield f"{name}{idx}", dataclasses.replace(tab, **fields)


def test_a_typo_in_any_coefficient_fails():
    passed = [where for where, bad in _typos(DOP853, ("A", "E3", "E5", "D"))
              if max(_dop_defects(bad)[1:]) < TOL]
    passed += [where for where, bad in _typos(RODAS4P2, ("a", "c", "h"))
                if max(_rodas_defects(bad)) < TOL]
    assert passed == []


# ------------------------------------------------------------------------- METHODS
@pytest.mark.parametrize("name", sorted(METHODS))
def test_methods_are_solve_ivps(name):
    """Every name is one that :func:`scipy.integrate.solve_ivp` accepts, for its class."""
    assert issubclass(METHODS[name], scipy.integrate.OdeSolver)
    r = scipy.integrate.solve_ivp(lambda t, y: -y, (0, 1), [1.0], method=name, rtol=1e-8)
    assert r.success and r.y[0, -1] == pytest.approx(np.exp(-1), rel=1e-5)
    assert gp.integrate.METHODS[name] is getattr(scipy.integrate, name)
