"""Sigmoid attention's particle kernel and field against the n x n formula written here."""

import numpy as np
import pytest
from scipy.special import expit

import gaussian_pde as gp

NAME = "sigmoid"


def _direct(att, Y, w, X):
    """V sum_j w_j sigma(c <Q x_i, K y_j> + b) y_j and the ESS of the weights per query."""
    W = expit(att.scale * (X @ att.Q.T) @ (Y @ att.K.T).T + att.bias) * w
    return W @ Y @ att.V.T, W.sum(1) ** 2 / (W**2).sum(1)


@pytest.mark.parametrize("chunk", [7, 10_000])
def test_particle_velocity_and_ess(rng, chunk):
    att = gp.get_attention(NAME).example(3, rng)
    x = rng.standard_normal((90, 3)) * 1.5
    v, diag = att.particle_velocity(x, chunk_size=chunk, want_ess=True)
    v_ref, ess_ref = _direct(att, x, np.full(90, 1 / 90), x)
    np.testing.assert_allclose(v, v_ref, rtol=1e-9, atol=1e-9 * np.abs(v_ref).max())
    np.testing.assert_allclose(diag.ess, ess_ref, rtol=1e-9)


def test_definition_field_on_weighted_atoms(rng):
    att = gp.get_attention(NAME).example(2, rng)
    Y, X = rng.standard_normal((40, 2)), rng.standard_normal((6, 2))
    w = rng.uniform(0.1, 1.0, 40)
    np.testing.assert_allclose(att.definition_field(Y, np.log(w), X),
                               _direct(att, Y, w / w.sum(), X)[0], rtol=1e-12, atol=1e-14)
