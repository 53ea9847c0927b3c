"""certified_limits' field on the engine: its rhs, Jacobian and growth measure, checked directly.

The field (``gaussian_pde.studies._certified_field``) is the precision
:math:`P = \\Sigma^{-1}` in factored variables :math:`P = LDL^T` and log time. It is held
to the precision equation :math:`dP/dt = -(PM + M^TP)` written directly in :math:`P`
(``_precision_rhs``), through the product rule :math:`dP = dL\\,DL^T + L\\,dD\\,L^T + LD\\,dL^T`;
its complex-step Jacobian to central differences; the same source run uncompiled
(``py_func``) to the compiled one; the engine's kernels of the packed weights to the field
itself, and the trace they report to :math:`\\operatorname{tr}P^{-1}`. A log-time run on
the engine is held to the exact precision of softmax with :math:`V = I`; the whole
integration is checked against exact solutions and the theorem in ``test_certified.py``.
"""

import warnings

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.studies import _certified as cert
from gaussian_pde.studies import _certified_field as cf
from gaussian_pde.studies._certified import exact_precision_softmax


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
    cf.kernels()                             # the helpers compiled (module globals)
    fn = cf._field if compiled else cf._field.py_func
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
    cf._jacobian(y, code, V, A, H, log_ts, k, 3, J)
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
    stays finite, and so does the Jacobian from there."""
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
    # and so does its complex-step Jacobian, which the engine's Rosenbrock steps take
    J = np.empty((y.size, y.size))
    cf._jacobian(y, code, V, A, H, 0.0, k, d, J)
    assert np.all(np.isfinite(J))


@pytest.mark.parametrize("kind", ["softmax", "l2", "both"])
def test_engine_kernels_are_the_field_of_the_packed_weights(kind):
    """rhs and jac of the packed vector give the field's and the Jacobian's bits, and rhs
    leaves tr Sigma = tr P^-1 (P = L D L^T) in ws[0]."""
    d = 4
    args = _setting(kind, d, seed=21)
    kinds, code, A, V, H, k, y, log_ts = args
    rhs, jac = cf.kernels()
    P = cf.pack(kinds, V[None], A[None], H[None], [np.exp(log_ts)], k)[0]
    out, ws = np.empty(y.size), np.zeros(1)
    rhs(P, y.size, 1, y, out, ws)
    np.testing.assert_array_equal(out, _field(args, y))
    np.testing.assert_array_equal(out, _field(args, y, compiled=False))
    S = np.linalg.inv(_precision(y, k, d)[0])
    np.testing.assert_allclose(ws[0], np.trace(S), rtol=1e-12)
    J, J0 = np.empty((y.size, y.size)), np.empty((y.size, y.size))
    assert jac(P, y.size, 1, y, J, ws)
    cf._jacobian(y, code, V, A, H, log_ts, k, d, J0)
    np.testing.assert_array_equal(J, J0)


def test_log_time_run_on_the_engine_matches_the_exact_precision():
    """Softmax, V = I, K = -Q: P(t) = Sigma_0^-1 + 2ct Q^T Q (docs/math.md 4.1). The engine's
    states at the checkpoints t = t_s (e^tau - 1), rebuilt into P, hold it to the tolerance."""
    d, c = 3, 0.5
    rng = np.random.default_rng(3)
    Q = rng.standard_normal((1, d))
    G = rng.standard_normal((d, d))
    cov0 = G @ G.T + np.eye(d)
    att = gp.Softmax(Q, -Q, np.eye(d), scale=c)
    kinds, A, V, H, U, rq, _ = cert._build([att], d)
    k = int(rq[0])
    u = U[0]
    P0 = u.T @ np.linalg.inv(cov0) @ u
    ch = np.linalg.cholesky(P0)
    dg = np.diag(ch)
    il = np.tril_indices(d, -1)
    y0 = np.concatenate([2.0 * np.log(dg), (ch / dg[None, :])[il]])
    ts = 2.0
    taus = np.log1p(np.array([0.0, 0.1, 1.0, 10.0, 1e3, 1e6]))
    rec, steps, stop, t_last = cert._integrate(kinds, V, A, H, np.array([ts]), k, y0[None],
                                               taus, 1e-9, np.array([np.inf]), 3000)
    assert stop[0] == "" and t_last[0] == taus[-1] and steps[0] > 0
    for tau, y in zip(taus, rec[0]):
        Pt = _precision(np.append(y, tau), k, d)[0]
        t = ts * np.expm1(tau)
        want = u.T @ exact_precision_softmax(Q, cov0, c, t) @ u
        np.testing.assert_allclose(Pt, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_growth_stops_a_row_where_its_trace_passes_the_limit():
    """A row whose limit is below tr Sigma_0 stops at its first step with "growth"; the
    others run on."""
    d = 3
    args = _setting("softmax", d, seed=4)
    kinds, _, A, V, H, k, y, log_ts = args
    y0 = np.tile(y[:-1], (2, 1))
    tr = np.trace(np.linalg.inv(_precision(np.append(y[:-1], 0.0), k, d)[0]))
    rec, steps, stop, t_last = cert._integrate(
        kinds, np.stack([V, V]), np.stack([A, A]), np.stack([H, H]), np.exp([log_ts] * 2), k,
        y0, np.log1p(np.array([0.0, 0.01, 0.1])), 1e-6, np.array([0.5 * tr, np.inf]), 3000)
    assert list(stop) == ["growth", ""]
    assert steps[0] == 1 and 0 < t_last[0] < np.log1p(0.01) and np.isnan(rec[0, 1:]).all()
    assert np.isfinite(rec[1]).all()


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
