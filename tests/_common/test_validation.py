"""Argument checks shared by every entry point: errors name the argument."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._common.validation import validate_allocation, validate_array

I2 = np.eye(2)


@pytest.mark.parametrize("call", [
    lambda: gp.Softmax(I2 * (1 + 1j), I2, I2),
    lambda: gp.L2(I2, I2, I2 + 0.5j),
    lambda: gp.solve(gp.Softmax(I2, I2, I2), None, I2 * (1 + 0.5j), (0, 1)),
    lambda: gp.solve(gp.Softmax(I2, I2, I2), np.array([1j, 0.0]), I2, (0, 1)),
    lambda: gp.moment_rhs(gp.Softmax(I2, I2, I2), np.array([0.0, 2j]), I2),
    lambda: gp.solve_batch(gp.Softmax(I2, I2, I2), (I2 * (1 + 1e-3j))[None], (0, 1)),
])
def test_complex_input_with_imaginary_part_is_refused(call):
    with pytest.raises(ValueError, match="must be real"):
        call()


def test_complex_input_with_zero_imaginary_part_is_its_real_part():
    np.testing.assert_array_equal(validate_array(np.array([1 + 0j, 2]), "x"), [1.0, 2.0])
    att = gp.Softmax(I2 + 0j, I2, I2)
    assert att.Q.dtype == float


def test_allocation_past_memory_is_refused_before_allocating():
    with pytest.raises(ValueError, match="`n` asks for"):
        gp.sample_gaussian(np.zeros(2), I2, 10**12)
    assert validate_allocation(1000, "n") == 1000


def test_bures_wasserstein_refuses_an_indefinite_covariance():
    with pytest.raises(ValueError, match="`cov1` must be positive semi-definite"):
        gp.bures_wasserstein(np.zeros(2), np.diag([1.0, -1.0]), np.zeros(2), I2)
    with pytest.raises(ValueError, match="`cov2`"):
        gp.bures_wasserstein(np.zeros(2), I2, np.zeros(2), np.array([[1.0, 2.0], [0.0, 1.0]]))


def test_covariance_is_returned_symmetric_and_as_a_copy(rng):
    """An exactly symmetric input comes back equal and not aliased; one within the
    tolerance comes back symmetrised; one beyond it is refused."""
    from gaussian_pde._common.validation import validate_covariance

    G = rng.standard_normal((4, 4))
    S = G @ G.T
    S = 0.5 * (S + S.T)
    out = validate_covariance(S, "cov0")
    assert out is not S and np.array_equal(out, S)
    out[0, 0] = -1.0
    assert S[0, 0] != -1.0
    near = S.copy()
    near[0, 1] += 1e-13 * np.abs(S).max()
    out = validate_covariance(near, "cov0")
    np.testing.assert_array_equal(out, out.T)
    np.testing.assert_allclose(out, S, rtol=0, atol=1e-13 * np.abs(S).max())
    far = S.copy()
    far[0, 1] += 1e-6 * np.abs(S).max()
    with pytest.raises(ValueError, match="symmetric"):
        validate_covariance(far, "cov0")
