"""When the closed-form L2 Jacobian is used, and the column-scaled differences beyond.

The reference is an extended-precision (mpmath) evaluation of the L2 field
L' = sum_h sqrt(2c) V L (I + B^T B)^{-1} B^T Q L, B = sqrt(2c) K L, and of its derivative,
at a state of the 6-D run of two L2 heads with V = I whose factor columns span 1e11.
"""

import mpmath as mp
import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._common import kernels, linalg
from gaussian_pde._common.differences import (
    JACOBIAN_SPREAD_MAX,
    central_jacobian,
    closed_form_holds,
    column_steps,
)
from gaussian_pde._common.factor_rotation import rotation
from gaussian_pde.attention import _compiled_fields as cf
from gaussian_pde.integrate._moment_field import compiled_field_values, moment_jacobian, reference_field


def two_l2_heads():
    r = np.random.default_rng(0)
    d = 6
    Q = r.standard_normal((d, d))
    heads = [gp.L2(Q, r.standard_normal((d, d)), np.eye(d)),
             gp.L2(r.standard_normal((d, d)), r.standard_normal((d, d)), np.eye(d))]
    return gp.MultiHead(heads)


@pytest.fixture(scope="module")
def graded():
    """``(attention, L)``: the run's factor at t = 9.5, with orthogonal columns."""
    att = two_l2_heads()
    L = gp.solve(att, None, np.eye(6), (0, 9.5)).factor[-1]
    return att, L @ rotation(L)


def field_mp(att, Lm):
    d = att.d
    out = mp.matrix(d, d)
    for h in att.heads:
        s = mp.sqrt(2 * mp.mpf(float(h.scale)))
        K, Q, V = (mp.matrix(X.tolist()) for X in (h.K, h.Q, h.V))
        B = s * K * Lm
        out += s * V * Lm * (mp.inverse(mp.eye(d) + B.T * B) * B.T) * Q * Lm
    return out


def column_tolerance(L):
    """The tolerance atol + rtol |L_b| a solver at the defaults asks of column b."""
    return 1e-12 + 1e-10 * np.sqrt((L * L).sum(axis=0))


def test_the_graded_state_spreads_far_beyond_the_closed_form_limit(graded):
    _, L = graded
    c = np.sqrt((L * L).sum(axis=0))
    assert c.max() / c.min() > 1e10 > JACOBIAN_SPREAD_MAX
    assert not closed_form_holds(L)
    assert closed_form_holds(np.eye(6)) and closed_form_holds(np.zeros((6, 6)))
    # a zero column (a rank-deficient covariance) is left out of the spread
    Z = np.diag([1.0, 2.0, 0.0])
    assert closed_form_holds(Z)
    assert closed_form_holds(np.stack([Z, L[:3, :3] * 0 + np.eye(3)])).all()


def test_the_field_keeps_each_column_at_its_own_precision(graded):
    """The QR gain: per-column errors far below the tolerance; the SVD gain misses it."""
    att, L = graded
    with mp.workdps(40):
        ref = np.array(field_mp(att, mp.matrix(L.tolist())).tolist(), dtype=float)
    tol = column_tolerance(L)
    err = np.sqrt(((compiled_field_values(att.compiled_field(), False)(L) - ref) ** 2)
                  .sum(axis=0))
    assert (err / tol).max() < 1e-3

    def svd_gain(B):                   # the bidiagonalising SVD holds s only to eps s_max
        U, s, Wt = np.linalg.svd(B)
        return (Wt.T * (s / (1 + s * s))) @ U.T

    F = sum(np.sqrt(2 * h.scale) * h.V @ L @ svd_gain(np.sqrt(2 * h.scale) * h.K @ L)
            @ h.Q @ L for h in att.heads)
    assert (np.sqrt(((F - ref) ** 2).sum(axis=0)) / tol).max() > 1e-2


def test_the_jacobian_beyond_the_limit_is_accurate_where_the_closed_form_is_not(graded):
    att, L = graded
    d = att.d
    Lm0 = mp.matrix(L.tolist())
    c = np.sqrt((L * L).sum(axis=0))
    J_ref = np.empty((d * d, d * d))
    with mp.workdps(40):
        for j in range(d * d):
            a, b = divmod(j, d)
            h = mp.mpf(10) ** -15 * c[b]
            up, down = Lm0.copy(), Lm0.copy()
            up[a, b] += h
            down[a, b] -= h
            J_ref[:, j] = np.array(((field_mp(att, up) - field_mp(att, down)) / (2 * h))
                                   .tolist(), dtype=float).ravel()
    tol = np.tile(column_tolerance(L), d)

    def error(J):      # |(J - J_ref) delta| for a perturbation of one tolerance per column
        return np.max(np.abs(J - J_ref) * tol[None, :] / tol[:, None])

    assert error(moment_jacobian(att, False)(0.0, L.ravel())) < 1e-6
    # the compiled closed form declines there, and would have been wrong: its parts
    # assembled as plain Python with the spread check switched off
    field = att.compiled_field()
    J = np.empty((d * d, d * d))
    assert not field.jac(field.params, d, d, L.ravel(), J, np.zeros(field.ws_size))
    assert error(closed_form_regardless(att, L)) > 1.0


def closed_form_regardless(att, L):
    """The sum of the heads' closed-form Jacobians at ``L``, past the spread limit too."""
    d = att.d
    J = np.zeros((d * d, d * d))
    for h in att.heads:
        field = h.compiled_field()
        head, = field.heads
        _, jac = cf._plain_kernels(head, "test")
        spread_ok, kernels.spread_ok = kernels.spread_ok, lambda Z, d: True
        try:
            Jh = np.zeros_like(J)
            assert jac(field.params, d, d, L.ravel(), Jh, np.zeros(field.ws_size))
        finally:
            kernels.spread_ok = spread_ok
        J += Jh
    return J


def test_central_differences_match_the_closed_form_where_it_holds():
    rng = np.random.default_rng(4)
    d = 4
    att = gp.L2(rng.standard_normal((d, d)), rng.standard_normal((d, d)),
                rng.standard_normal((d, d)) / 2)
    for with_mean in (False, True):
        m = d + 1 if with_mean else d
        Z = rng.standard_normal((d, m))
        assert closed_form_holds(Z[:, :d])
        J_closed = moment_jacobian(att, with_mean)(0.0, Z.ravel())
        J_diff = central_jacobian(reference_field(att, with_mean), Z)
        np.testing.assert_allclose(J_diff, J_closed, rtol=0,
                                   atol=1e-8 * np.abs(J_closed).max())


def test_steps_follow_each_column_and_a_zero_column_takes_the_shortest():
    Z = np.array([[1e8, 1e-3, 0.0], [0.0, 2e-3, 0.0]])
    steps = column_steps(Z)
    eps3 = np.finfo(float).eps ** (1 / 3)
    np.testing.assert_allclose(steps[0], eps3 * np.array([1e8, np.sqrt(5e-6), np.sqrt(5e-6)]))
    np.testing.assert_array_equal(steps[0], steps[1])
    np.testing.assert_array_equal(column_steps(np.zeros((2, 2))), eps3)


@pytest.mark.parametrize("method", ["LSODA", "BDF", "Radau"])
def test_implicit_methods_cross_the_graded_run(method):
    """Regression: given the closed form at a spread of 1e11, LSODA, BDF and Radau crawled
    (Radau and BDF spent 100,000 evaluations, 41 and 50 s); they now finish and agree
    with a tight DOP853 run on every eigenvalue, the four small ones included."""
    from tests._helpers import run_within

    att = two_l2_heads()
    sol = run_within(60, gp.solve, att, None, np.eye(6), (0, 10), method=method,
                     max_nfev=60_000)
    assert sol.status == "finished", sol.message
    ref = gp.solve(att, None, np.eye(6), (0, 10), rtol=1e-12, atol=1e-14, max_nfev=6_000)

    def eigs(L):
        return np.linalg.svd(L, compute_uv=False)[::-1] ** 2

    np.testing.assert_allclose(eigs(sol.factor[-1]), eigs(ref.factor[-1]), rtol=1e-6)


@pytest.mark.slow
def test_rosenbrock_batch_crosses_the_graded_run():
    """RODAS4P2 takes a fresh Jacobian at every step: 2 d^2 field states beyond the spread
    limit, about 180,000 evaluations to t = 10 (it failed at 100,000 before)."""
    from tests._helpers import run_within

    att = two_l2_heads()
    bat = run_within(60, gp.solve_batch, att, np.eye(6)[None], (0, 10), method="rosenbrock",
                     max_nfev=300_000)
    assert str(bat.status[0]) == "finished", bat.message[0]
    ref = gp.solve(att, None, np.eye(6), (0, 10), rtol=1e-12, atol=1e-14, max_nfev=6_000)
    np.testing.assert_allclose(np.linalg.svd(bat.factor_final[0], compute_uv=False),
                               np.linalg.svd(ref.factor[-1], compute_uv=False), rtol=1e-6)


def test_a_graded_stack_gets_the_same_gain_as_each_matrix():
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    S = np.stack([rng.standard_normal((3, 5)) @ (U * np.logspace(8, -1, 5)) for _ in range(4)])
    G, E = linalg.l2_gain_parts(S)
    for i in range(4):
        Gi, Ei = linalg.l2_gain_parts(S[i])
        np.testing.assert_allclose(G[i], Gi, rtol=1e-10, atol=1e-14 * np.abs(Gi).max())
        np.testing.assert_allclose(E[i], Ei, rtol=1e-10, atol=1e-14 * np.abs(Ei).max())
