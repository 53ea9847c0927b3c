"""The one-sided Jacobi SVD against its defining identities and against LAPACK's."""

import numpy as np
import pytest

from gaussian_pde._common.jacobi import jacobi_svd


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 2), (3, 3), (4, 4), (5, 3)])
def test_jacobi_svd_is_an_svd(shape):
    """A0 V = U S with orthonormal V and U, S decreasing and equal to LAPACK's values."""
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        # columns of scales 1e-6 .. 1e6: the rotations must keep each value's digits
        A0 = rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 6, (1, shape[1]))
        A = A0.copy()
        s = np.empty(shape[1])
        V = np.empty((shape[1], shape[1]))
        assert jacobi_svd(A, s, V)
        ref = np.linalg.svd(A0, compute_uv=False)
        np.testing.assert_allclose(s, ref, rtol=1e-13, atol=1e-15 * ref[0])
        assert np.all(np.diff(s) <= 0)
        np.testing.assert_allclose(V.T @ V, np.eye(shape[1]), atol=1e-14)
        np.testing.assert_allclose(A, A0 @ V, atol=1e-14 * ref[0])      # A = U S
        U = A / s
        np.testing.assert_allclose(U.T @ U, np.eye(shape[1]), atol=1e-12)
        np.testing.assert_allclose((A * 1.0) @ V.T, A0, atol=1e-13 * ref[0])


def test_jacobi_svd_rank_deficient_and_not_finite():
    """A zero column and a repeated one: zero singular values; NaN: refused."""
    A0 = np.array([[1.0, 0.0, 1.0], [2.0, 0.0, 2.0], [0.5, 0.0, 0.5]])
    A = A0.copy()
    s, V = np.empty(3), np.empty((3, 3))
    assert jacobi_svd(A, s, V)
    np.testing.assert_allclose(s, [np.sqrt(2 * 5.25), 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(A @ V.T, A0, atol=1e-15)
    A = A0.copy()
    A[1, 2] = np.nan
    assert not jacobi_svd(A, s, V)


def test_compiled_engine_refactor_and_rank_use_it():
    """The compiled integrator's rank event and re-factorisation take the Jacobi SVD:
    the rank gap is sigma_j^2 / sum sigma^2 - tol with sigma from LAPACK."""
    from gaussian_pde.integrate import _compiled_batch as cb

    rng = np.random.default_rng(3)
    d, m = 3, 4
    y = rng.standard_normal(d * m)
    L = y.reshape(d, m)[:, :d]
    w = np.linalg.eigvalsh(L @ L.T)           # increasing
    for first in range(d):
        assert cb._rank_gap(y, d, m, first, 1e-3) == pytest.approx(
            w[first] / w.sum() - 1e-3, rel=1e-12, abs=1e-15)
