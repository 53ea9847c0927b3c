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
