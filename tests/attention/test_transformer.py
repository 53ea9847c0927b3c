"""The attention of a Transformer layer built from weights: one head, and the sum of heads."""

import numpy as np
import pytest
from scipy.special import softmax

import gaussian_pde as gp
from gaussian_pde.attention import dot_product_head, has_hook, sum_of_heads


def _direct(x, Q, K, V, scale, q, k_b):
    """V sum_j softmax_j(c (Q x_i + q)^T (K x_j + k_b)) x_j, by the n x n formula."""
    S = scale * (x @ Q.T + q) @ (x @ K.T + k_b).T
    return softmax(S, axis=1) @ x @ V.T


@pytest.mark.parametrize("biases", [False, True])
def test_dot_product_head_is_the_softmax_of_the_dot_product(rng, biases):
    d, k, n = 3, 2, 40
    Q, K = rng.standard_normal((2, k, d))
    V = rng.standard_normal((d, d))
    q, k_b = (rng.standard_normal((2, k)) if biases else np.zeros((2, k)))
    att = dot_product_head(Q, K, V, scale=0.7, **(dict(q=q, k_b=k_b) if biases else {}))
    x = rng.standard_normal((n, d))
    v, _ = att.particle_velocity(x)
    np.testing.assert_allclose(v, _direct(x, Q, K, V, 0.7, q, k_b), rtol=1e-12, atol=1e-12)
    # zero biases are plain softmax: the same moment equations
    plain = dot_product_head(Q, K, V, scale=0.7)
    zero = dot_product_head(Q, K, V, scale=0.7, q=np.zeros(k), k_b=np.zeros(k))
    mean, cov = rng.standard_normal(d), np.eye(d) + 0.1 * np.ones((d, d))
    for a, b in zip(gp.moment_rhs(plain, mean, cov), gp.moment_rhs(zero, mean, cov)):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)


def test_sum_of_heads_adds_the_fields(rng):
    d = 3
    heads = [dot_product_head(*rng.standard_normal((2, 2, d)), np.eye(d)) for _ in range(3)]
    att = sum_of_heads(heads)
    mean, cov = rng.standard_normal(d), np.eye(d)
    x = rng.standard_normal((5, d))
    np.testing.assert_allclose(att.velocity(mean, cov, x),
                               sum(h.velocity(mean, cov, x) for h in heads), rtol=1e-13)
    assert att.heads == tuple(heads)


@pytest.mark.parametrize("name", list(gp.ATTENTIONS))
def test_from_heads_is_a_sum_or_none(rng, name):
    """A type that implements ``from_heads`` sums any Gaussian-preserving heads; the
    default answers None (a single head)."""
    cls = gp.ATTENTIONS[name]
    heads = [dot_product_head(*rng.standard_normal((2, 1, 2)), np.eye(2)) for _ in range(2)]
    if not has_hook(cls, "from_heads"):
        assert cls.from_heads(heads) is None
        return
    att = cls.from_heads(heads)
    mean, cov = rng.standard_normal(2), np.eye(2)
    np.testing.assert_allclose(att.field_matrix_with_mean(cov, mean),
                               sum(h.field_matrix_with_mean(cov, mean) for h in heads), rtol=1e-13)
