"""certified_limits' one integration loop: its field, Jacobian and steps, checked directly.

The loop (``gaussian_pde.studies._certified_compiled``) integrates the precision
:math:`P = \\Sigma^{-1}` in factored variables :math:`P = LDL^T` and log time. Its field is
held to the precision equation :math:`dP/dt = -(PM + M^TP)` written directly in :math:`P`
(``_precision_rhs``), through the product rule :math:`dP = dL\\,DL^T + L\\,dD\\,L^T + LD\\,dL^T`;
its complex-step Jacobian to central differences; the same source run uncompiled
(``py_func``) to the compiled one. The whole loop is checked against exact solutions and
the theorem in ``test_certified.py``.
"""

import warnings

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.studies import _certified as cert
from gaussian_pde.studies import _certified_compiled as cc


def _setting(kind, d, seed):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((2, d))
    R = rng.standard_normal((d, d))
    heads = {"softmax": [gp.Softmax(Q, -Q, R / d, scale=0.5)],
             "l2": [gp.L2(Q, -Q, R.T @ R / d, scale=0.7)]}
    heads["both"] = heads["softmax"] + heads["l2"]
    att = heads[kind][0] if len(heads[kind]) == 1 else gp.MultiHead(heads[kind])
    kinds, A, V, H, U, rq, _ = cert._build([att], d)
    k = int(rq[0])
    n_low = d * (d - 1) // 2
    y = np.concatenate([rng.uniform(-1.0, 1.0, d), 0.5 * rng.standard_normal(n_low),
                        [rng.uniform(0.0, 3.0)]])            # (ell, L~, tau)
    code = np.array([0 if kd == "bilinear" else 1 for kd in kinds], dtype=np.int64)
    log_ts = float(np.log(rng.uniform(1.0, 5.0)))
    return kinds, code, A[0], V[0], H[0], k, y, log_ts


def _field(args, y, compiled=True):
    kinds, code, A, V, H, k, _, log_ts = args
    cc._core()                               # the helpers compiled (module globals)
    fn = cc._field if compiled else cc._field.py_func
    out = np.empty(y.size, dtype=y.dtype)
    fn(y, code, V, A, H, log_ts, k, A.shape[-1], out)
    return out


def _precision(y, k, d):
    """P, L, D and T of the augmented state (L~ on the block N x R is T L)."""
    T = np.exp(y[-1])
    L = np.eye(d)
    il, jl = np.tril_indices(d, -1)
    nr = (il >= k) & (jl < k)
    L[il, jl] = np.where(nr, y[d:-1] / T, y[d:-1])
    D = np.diag(np.exp(y[:d]))
    return L @ D @ L.T, L, D, T, (il, jl, nr)


@pytest.mark.parametrize("kind", ["softmax", "l2", "both"])
@pytest.mark.parametrize("d", [2, 3, 4])
def test_field_is_the_precision_equation(kind, d):
    args = _setting(kind, d, seed=10 * d + len(kind))
    kinds, _, A, V, H, k, y, log_ts = args
    out = _field(args, y)
    assert out[-1] == 1.0                                  # d tau / d tau
    P, L, D, T, (il, jl, nr) = _precision(y, k, d)
    dL = np.zeros((d, d))
    # d L~/d tau = T dL/d tau + T L on the block N x R (d T / d tau = T), dL elsewhere
    dL[il, jl] = np.where(nr, out[d:-1] / T - L[il, jl], out[d:-1])
    dD = np.diag(np.exp(y[:d]) * out[:d])
    dP = dL @ D @ L.T + L @ dD @ L.T + L @ D @ dL.T
    S = np.linalg.inv(P)
    want = np.exp(log_ts) * T * cert._precision_rhs(kinds, A[None], V[None], H[None],
                                                   P[None], S[None])[0]
    np.testing.assert_allclose(dP, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["softmax", "l2", "both"])
def test_uncompiled_source_equals_compiled(kind):
    args = _setting(kind, 3, seed=5)
    y = args[6]
    np.testing.assert_array_equal(_field(args, y, compiled=False), _field(args, y))


@pytest.mark.parametrize("kind", ["softmax", "l2", "both"])
def test_complex_step_jacobian_equals_central_differences(kind):
    args = _setting(kind, 3, seed=9)
    kinds, code, A, V, H, k, y, log_ts = args
    J = np.empty((y.size, y.size))
    cc._jacobian(y, code, V, A, H, log_ts, k, 3, J)
    eps = 1e-6
    fd = np.empty_like(J)
    for j in range(y.size):
        e = np.zeros(y.size)
        e[j] = eps
        fd[:, j] = (_field(args, y + e) - _field(args, y - e)) / (2 * eps)
    np.testing.assert_allclose(J, fd, rtol=1e-6, atol=1e-7 * np.abs(J).max())


def test_the_l2_gain_survives_where_the_form_in_p_is_singular():
    """The L2 field inverts G = I + e H e (e = exp(-ell/2)), whose exact eigenvalues are
    >= 1. With e up to 2e18 the gain formed directly, I + e H e, is singular to rounding
    (LAPACK raises); the field's elimination without pivoting keeps the first pivot 2 and
    stays finite, and a step from there has a finite error estimate."""
    d, k = 3, 1
    H = np.ones((1, d, d))
    A = np.zeros((1, d, d))
    A[0, 0, 0] = 1.0
    V = np.eye(d)[None].copy()
    code = np.array([1])
    y = np.zeros(d + d * (d - 1) // 2 + 1)
    y[:d] = [0.0, -40.0, -84.0]                  # e = (1, 5e8, 2e18)
    e = np.exp(-0.5 * y[:d])
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.inv(np.eye(d) + e[:, None] * H[0] * e[None, :])
    out = _field(((), code, A, V, H, k, y, 0.0), y)
    assert np.all(np.isfinite(out))
    r = gp.integrate.RODAS4
    y_new = np.empty_like(y)
    err = cc._attempt(y, 1e-3, 1e-6, code, V, A, H, 0.0, k, d, np.ascontiguousarray(r.a),
                      np.ascontiguousarray(r.c), np.ascontiguousarray(r.b), float(r.gamma),
                      y_new)
    assert np.isfinite(err) and np.all(np.isfinite(y_new))


def test_compiled_is_deprecated_and_changes_nothing():
    Q = np.array([[0.6, -0.3, 0.8]])
    att = gp.Softmax(Q, -Q, np.eye(3))
    plain = gp.certified_limits([att], [np.eye(3)])[0]
    with pytest.warns(FutureWarning, match="`compiled` is deprecated"):
        old = gp.certified_limits([att], [np.eye(3)], compiled=False)[0]
    assert plain.path == old.path == "compiled"
    assert (plain.outcome, plain.rank, plain.steps) == (old.outcome, old.rank, old.steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gp.certified_limits([att], [np.eye(3)])          # no warning by default
