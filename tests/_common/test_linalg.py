"""The L2 gain's two paths: a Cholesky solve for moderate ``B``, Householder QR beyond."""

import numpy as np
import pytest

from gaussian_pde._common import linalg
from gaussian_pde._common.linalg import GAIN_SOLVE_MAX, l2_gain, l2_gain_parts


def qr_parts(B):
    return linalg._gain_by_qr(B)


@pytest.mark.parametrize("k,d", [(1, 3), (2, 5), (3, 5), (5, 5), (6, 3)])
def test_solve_path_agrees_with_the_qr_to_rounding(k, d):
    rng = np.random.default_rng(k * 10 + d)
    for scale in (1e-8, 1e-2, 1.0, 4.0):
        B = scale * rng.standard_normal((k, d))
        assert np.sum(B * B) < GAIN_SOLVE_MAX
        G_qr, E_qr = qr_parts(B)
        G, E = l2_gain_parts(B)
        # QR of [B; I] is backward stable column by column: its error is rounding
        # relative to max(|B_j|, 1), absolute for a tiny B
        for got, want in ((l2_gain(B), G_qr), (G, G_qr), (E, E_qr)):
            assert np.abs(got - want).max() <= 1e-13 * max(np.abs(want).max(), 1e-2)
        # a strided view (as in the fused kernel) gives the same gain
        wide = np.zeros((k + 1, d + 2))
        wide[:k, :d] = B
        np.testing.assert_array_equal(l2_gain(wide[:k, :d]), l2_gain(B))


def test_the_push_through_identity_holds_on_the_solve_path():
    rng = np.random.default_rng(0)
    B = rng.standard_normal((2, 5))
    G = l2_gain(B)
    np.testing.assert_allclose((np.eye(5) + B.T @ B) @ G, B.T, rtol=0, atol=1e-14)


@pytest.mark.parametrize("scale", [40.0, 1e150, 1e300])
def test_large_b_takes_the_qr_path_without_overflow(scale):
    rng = np.random.default_rng(1)
    B = scale * rng.standard_normal((2, 5))
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        G = l2_gain(B)
        G_parts, E = l2_gain_parts(B)
    np.testing.assert_array_equal(G, qr_parts(B)[0])
    np.testing.assert_array_equal(E, qr_parts(B)[1])
    assert np.isfinite(G).all() and np.isfinite(G_parts).all()


def test_a_stack_takes_each_path_per_matrix():
    rng = np.random.default_rng(2)
    S = rng.standard_normal((4, 2, 5))
    S[1] *= 1e200
    S[3] *= 30.0                      # |B|_F^2 above the threshold
    G = l2_gain(S)
    G_parts, E = l2_gain_parts(S)
    for i in range(4):
        np.testing.assert_allclose(G[i], l2_gain(S[i]), rtol=1e-13, atol=0)
        np.testing.assert_allclose(G_parts[i], l2_gain(S[i]), rtol=1e-13, atol=0)
        np.testing.assert_allclose(E[i], l2_gain_parts(S[i])[1], rtol=1e-13, atol=0)


def test_non_finite_b_gives_nan_without_lapack():
    # a non-finite trial state never reaches LAPACK: its gain is NaN (a rejected
    # step), and in a stack only that matrix is NaN
    for bad in (np.nan, np.inf):
        B = np.array([[bad, 1.0, 0.0]])
        assert np.isnan(l2_gain(B)).all()
        G, E = l2_gain_parts(B)
        assert np.isnan(G).all() and np.isnan(E).all()
    S = np.stack([np.array([[np.nan, 1.0, 0.0]]), np.array([[40.0, 1.0, 0.0]])])
    G, E = l2_gain_parts(S)
    assert np.isnan(G[0]).all() and np.isnan(E[0]).all()
    np.testing.assert_allclose(G[1], l2_gain(S[1]), rtol=1e-13, atol=0)


def test_psd_factor_of_one_matrix_equals_the_stacked_path_bit_for_bit(rng):
    """The single-matrix shortcut (full numerical rank) gives exactly the numbers of the
    stacked computation; a singular matrix keeps its exact zero columns."""
    from gaussian_pde._common.linalg import psd_factor

    for d in range(1, 7):
        G = rng.standard_normal((d, d))
        S = G @ G.T
        np.testing.assert_array_equal(psd_factor(S), psd_factor(S[None])[0])
        if d > 1:
            H = rng.standard_normal((d, d - 1))
            L = psd_factor(H @ H.T)
            np.testing.assert_array_equal(L, psd_factor((H @ H.T)[None])[0])
            assert np.sum(np.all(L == 0.0, axis=0)) == 1


def test_shifted_cholesky_says_full_rank_only_where_the_eigenvalues_do(rng):
    """has_full_numerical_rank (rank_note's quick test): True only where numerical_rank
    is d, and True on the well-conditioned matrices of most runs; graded spectra down to 1e-18 relative, with
    the smallest eigenvalue on either side of the cut d eps tr(S)."""
    from gaussian_pde._common.linalg import has_full_numerical_rank, numerical_rank

    said = 0
    for _ in range(3000):
        d = int(rng.integers(1, 7))
        U = np.linalg.qr(rng.standard_normal((d, d)))[0]
        w = 10.0 ** rng.uniform(-18, 0, size=d)
        w[rng.integers(d)] = 1.0
        S = (U * w) @ U.T
        S = 0.5 * (S + S.T)
        if has_full_numerical_rank(S):
            said += 1
            assert numerical_rank(S) == d, (w, np.linalg.eigvalsh(S))
    assert said > 300
    well = [np.eye(3) + 0.1 * np.ones((3, 3)), np.diag([1.0, 1e-6, 1e-12])]
    assert all(has_full_numerical_rank(S) for S in well)
    assert not has_full_numerical_rank(np.zeros((2, 2)))
    assert not has_full_numerical_rank(np.diag([1.0, 0.0]))
