"""The compiled batch integrator against independent references, exact solutions and invariants.

The references: SciPy's :func:`~scipy.integrate.solve_ivp` on the factor equation
``L' = M(L L^T) L`` (the attention's own NumPy ``factor_rhs``), whose DOP853 takes the
same steps as the batch's with ``method="DOP853"`` (the same tableau, error norm, step
rule and first step: the same step and evaluation counts, states to rounding), or at a
tight tolerance for RODAS4P2; :func:`gaussian_pde.solve` on SciPy's or Hairer's loop
(``method="DOP853"``) for the events and blow-up verdicts; closed forms
(:func:`gaussian_pde.exact_covariance`, :func:`gaussian_pde.blowup_time`).
"""

import collections

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import gaussian_pde as gp
from gaussian_pde._common.linalg import psd_factor
from gaussian_pde.attention import has_hook
from tests._helpers import random_spd

#: the registered types with a compiled field whose covariance equation is mean-free
#: (the settings below start from a covariance alone)
COMPILED = [name for name, cls in gp.ATTENTIONS.items()
            if has_hook(cls, "compiled_field") and not cls.field_sees_mean]


def _scipy_factor(att, cov, t1, method="DOP853", **kw):
    """SciPy's ``solve_ivp`` on ``L' = factor_rhs(L)`` from the batch's factor of ``cov``;
    returns the result and the final covariance."""
    d = att.d
    L0 = psd_factor(cov)
    res = solve_ivp(lambda t, y: att.factor_rhs(y.reshape(d, d)).ravel(), (0.0, t1),
                    L0.ravel(), method=method, **kw)
    L = res.y[:, -1].reshape(d, d)
    return res, L @ L.T


def _settings(rng, d, kinds=tuple(COMPILED)):
    atts, covs = [], []
    for i, kind in enumerate(kinds * 2):
        att = gp.ATTENTIONS[kind].example(d, rng)
        atts.append(att)
        covs.append(random_spd(rng, d, rank=d if i % 3 else d - 1))
    return atts, np.array(covs)


@pytest.mark.parametrize("d", [2, 4])
def test_compiled_takes_scipys_dop853_steps(rng, d):
    """``method="DOP853"``: a finished run takes SciPy's DOP853 steps on the factor (the
    same accepted steps and evaluations, the state to rounding: the pinned 1e-11 leaves
    two orders over the ~1e-13 seen), until the batch re-factors ``L -> LW`` (at a
    look every ``REFACTOR_EVERY`` steps where the columns cancel past
    ``REFACTOR_ABOVE``; the error norm is that of the entries of ``L``, so the steps
    move on from there). A run that blows up has the verdict and the blow-up time of
    ``gp.solve`` (SciPy has no blow-up event; both extrapolate ``1/tr``, at the step end
    and at the located crossing: 1e-7)."""
    from gaussian_pde._common.factor_rotation import REFACTOR_ABOVE, REFACTOR_EVERY, cancellation_excess

    atts, covs = _settings(rng, d)
    statuses = set()
    same_steps = 0
    for att, cov in zip(atts, covs):
        a = gp.solve_batch(att, cov[None], (0.0, 3.0), max_nfev=5000, method="DOP853")
        statuses.add(str(a.status[0]))
        if "gave up" in a.message[0]:   # a long run to the budget: rounding moves its end
            continue
        if a.status[0] == "finished":
            ref, cov_ref = _scipy_factor(att, cov, 3.0, rtol=1e-10, atol=1e-12)
            assert ref.status == 0, ref.message
            looks = ref.y[:, REFACTOR_EVERY::REFACTOR_EVERY].T.reshape(-1, d, d)
            if not np.any(cancellation_excess(looks, 1e-12, 1e-10) > REFACTOR_ABOVE):
                assert a.nsteps[0] == ref.t.size - 1 and a.nfev[0] == ref.nfev, att
                same_steps += 1
            np.testing.assert_allclose(a.cov_final[0], cov_ref, rtol=0,
                                       atol=1e-11 * np.abs(cov_ref).max(), err_msg=repr(att))
        else:
            ref = gp.solve(att, None, cov, (0.0, 3.0), max_nfev=5000, method="DOP853")
            assert str(a.status[0]) == str(ref.status), (att, a.message, ref.message)
            assert a.t_blowup[0] == pytest.approx(ref.t_blowup, rel=1e-7), att
    assert "finished" in statuses and same_steps >= 4


def test_compiled_rosenbrock_and_auto_against_lsoda(rng):
    """The paper's stiff setting (K = -Q): the stiffness test hands over to RODAS4P2, whose
    states agree with LSODA's at a tight tolerance (RODAS4P2 at rtol 1e-8, order 4: seen
    ~1e-9 of the covariance's scale; pinned 1e-7, as test_batch's stiff comparison)."""
    from tests.integrate.test_batch import _stiff_settings

    w, covs = _stiff_settings([0, 3])
    T = 1e4
    atts = [gp.Softmax(Q, K, V, scale=s)
            for Q, K, V, s in zip(w["Q"], w["K"], w["V"], w["scale"])]
    refs = [_scipy_factor(att, cov, T, method="LSODA", rtol=1e-12, atol=1e-14)
            for att, cov in zip(atts, covs)]
    assert all(res.status == 0 for res, _ in refs)
    ref = np.array([c for _, c in refs])
    kw = dict(rtol=1e-8, atol=1e-14, max_nfev=None)
    for method in ("auto", "rosenbrock"):
        a = gp.solve_batch(w, covs, (0.0, T), method=method, **kw)
        assert a.path == "compiled" and a.implicit.all()
        assert (a.status == "finished").all()
        scale = np.abs(ref).max(axis=(1, 2))[:, None, None]
        np.testing.assert_allclose(a.cov_final / scale, ref / scale, rtol=0, atol=1e-7)
    # L2 and Sinkhorn heads: RODAS4P2 with the L2 closed form, central differences otherwise
    d = 3
    G = rng.standard_normal((d, d))
    att = gp.MultiHead([gp.L2.example(d, rng), gp.Sinkhorn.example(d, rng)])
    covs = np.array([G @ G.T / d, np.eye(d)])
    a = gp.solve_batch(att, covs, (0.0, 5.0), method="rosenbrock")
    assert a.implicit.all() and (a.status == "finished").all()
    for b in range(2):
        _, cov_ref = _scipy_factor(att, covs[b], 5.0, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(a.cov_final[b], cov_ref, rtol=0,
                                   atol=1e-8 * np.abs(cov_ref).max())


def test_compiled_exact_covariance_and_blowup_time(rng):
    """Softmax with V = I: Sigma(t) = R (I - t R S R)^{-1} R and t* in closed form."""
    d = 3
    Q, K = rng.standard_normal((2, d)), rng.standard_normal((2, d))
    att = gp.Softmax(Q, K, np.eye(d))
    covs = np.array([random_spd(rng, d) for _ in range(6)])
    t_star = np.array([gp.blowup_time(att, c) for c in covs])
    t_eval = np.linspace(0.0, 0.9 * t_star.min(), 7)
    sol = gp.solve_batch(att, covs, (0.0, 10 * t_star.max()), t_eval=t_eval)
    assert sol.path == "compiled"
    assert all(s == "blowup" for s in sol.status)
    np.testing.assert_allclose(sol.t_blowup, t_star, rtol=1e-8)
    for b in range(covs.shape[0]):
        exact = gp.exact_covariance(att, covs[b], t_eval)
        err = np.abs(sol.cov[b] - exact).max(axis=(-2, -1)) / np.abs(exact).max(axis=(-2, -1))
        assert err.max() < 1e-8, err


def test_compiled_dense_output_matches_steps(rng):
    """t_eval from the dense output equals runs that end at those times."""
    att = gp.L2.example(3, rng)
    cov = random_spd(rng, 3)
    t_eval = np.array([0.0, 0.3, 1.1, 2.0])
    sol = gp.solve_batch(att, cov[None], (0.0, 2.0), t_eval=t_eval)
    np.testing.assert_array_equal(sol.cov[0, 0], cov)
    for j, t in enumerate(t_eval[1:], start=1):
        end = gp.solve_batch(att, cov[None], (0.0, t), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sol.cov[0, j], end.cov_final[0], rtol=1e-8, atol=1e-12)


def test_compiled_events_and_statuses_match_solve(rng):
    """Steady state (relative and absolute) and rank collapse against ``gp.solve`` on
    SciPy's or Hairer's loop: the same statuses, stop times and outputs up to the stop;
    and the evaluation budget."""
    q = np.array([[1.0, 0.3]])
    att = gp.Softmax(q, -q, np.eye(2))
    covs = np.array([random_spd(rng, 2) for _ in range(3)])
    t_eval = np.geomspace(1e-3, 1e6, 9)
    seen = set()
    for kw in ({"steady_tol": 1e-3}, {"rank_tol": 1e-2}, {"steady_atol": 1e-4}):
        a = gp.solve_batch(att, covs, (0.0, 1e6), t_eval=t_eval, **kw)
        for b in range(covs.shape[0]):
            ref = gp.solve(att, None, covs[b], (0.0, 1e6), t_eval=t_eval, method="DOP853",
                           **kw)
            assert str(a.status[b]) == str(ref.status), kw
            seen.add(str(ref.status))
            # (a located event moves with the rounding of its gap function, which crosses
            # zero slowly: seen 1e-8 relative for the rank collapse)
            assert a.t_final[b] == pytest.approx(ref.t_final, rel=1e-6), kw
            n = ref.t.size
            scale = np.abs(ref.cov).max()
            np.testing.assert_allclose(a.cov[b, :n], ref.cov, rtol=0, atol=1e-7 * scale)
            assert np.isnan(a.cov[b, n:]).all()         # NaN: stopped
    assert seen >= {"steady", "rank_collapse"}
    a = gp.solve_batch(att, covs, (0.0, 1e6), max_nfev=400)
    assert {str(s) for s in a.status} == {"failed"}
    assert all("gave up after 400" in m for m in a.message)


def test_compiled_mean_matches_solve(rng):
    """The mean rides in the state [L | alpha] with solve's units; solve is the reference."""
    d = 3
    atts = [gp.Softmax.example(d, rng), gp.L2.example(d, rng), gp.Sinkhorn.example(d, rng),
            gp.MultiHead([gp.Softmax.example(d, rng), gp.L2.example(d, rng)])]
    covs = np.array([random_spd(rng, d) for _ in atts])
    means = rng.standard_normal((len(atts), d)) * np.array([[1.0], [1e3], [1e-3], [1.0]])
    t_eval = np.linspace(0.0, 1.5, 4)
    sol = gp.solve_batch(atts, covs, (0.0, 1.5), mean0s=means, t_eval=t_eval)
    assert sol.path == "compiled" and sol.mean.shape == (len(atts), 4, d)
    for b, att in enumerate(atts):
        ref = gp.solve(att, means[b], covs[b], (0.0, 1.5), t_eval=t_eval, rtol=1e-12,
                       atol=1e-14)
        assert str(sol.status[b]) == str(ref.status)
        np.testing.assert_allclose(sol.mean[b], ref.mean, rtol=1e-7,
                                   atol=1e-7 * np.abs(ref.mean).max())
        np.testing.assert_allclose(sol.cov[b], ref.cov, rtol=1e-7,
                                   atol=1e-9 * np.abs(ref.cov).max())
        tr = sol.trajectory(b)
        np.testing.assert_array_equal(tr.mean_final, sol.mean_final[b])
    # the mean does not change the covariance's trajectory (its equation is free of it)
    alone = gp.solve_batch(atts, covs, (0.0, 1.5), t_eval=t_eval)
    np.testing.assert_allclose(sol.cov, alone.cov, rtol=1e-7, atol=1e-12)


def test_compiled_mean_stiff_rosenbrock_matches_dop853(rng):
    """RODAS4P2 with the mean rows of the Jacobian against DOP853 at a tight tolerance."""
    d = 3
    Q = rng.standard_normal((1, d))
    G = rng.standard_normal((d, d))
    att = gp.Softmax(Q, -Q, G.T @ G / d)
    cov = G @ G.T / d
    mean = rng.standard_normal((1, d))
    a = gp.solve_batch(att, cov[None], (0.0, 20.0), mean0s=mean, method="rosenbrock")
    b = gp.solve_batch(att, cov[None], (0.0, 20.0), mean0s=mean, method="DOP853",
                       rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(a.mean_final, b.mean_final, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(a.cov_final, b.cov_final, rtol=1e-6, atol=1e-9)


def test_compiled_trajectories_are_independent_and_scale(rng):
    """A batch (the parallel driver) equals each trajectory alone (the serial driver):
    the same code runs per trajectory, so bit for bit; and softmax's quadratic field
    gives t*(c Sigma_0) = t*(Sigma_0) / c."""
    from gaussian_pde.integrate._compiled_engine import SERIAL_BELOW

    atts, covs = _settings(rng, 3)
    assert 1 < SERIAL_BELOW <= len(atts)
    together = gp.solve_batch(atts, covs, (0.0, 2.0))
    for b, att in enumerate(atts):
        alone = gp.solve_batch(att, covs[b][None], (0.0, 2.0))
        np.testing.assert_array_equal(alone.cov_final[0], together.cov_final[b])
        assert alone.nfev[0] == together.nfev[b]
    att = gp.Softmax(np.eye(2), np.eye(2), 0.7 * np.eye(2) + 0.1)
    cov = random_spd(rng, 2)
    c = np.array([1.0, 4.0, 1e-3])
    sol = gp.solve_batch(att, c[:, None, None] * cov, (0.0, 1e5))
    np.testing.assert_allclose(sol.t_blowup * c, sol.t_blowup[0], rtol=1e-8)


def test_one_driver_call_reuses_its_scratch_without_carrying_state(rng):
    """Fewer than SERIAL_BELOW trajectories run in one driver call, one after the other
    in the same scratch (the stages, the event gaps, the dense-output flag, the
    rejection counts): each equals itself alone, bit for bit, whatever ran before it;
    here a run that stops at a steady state, one that blows up, one cut by t_eval."""
    from gaussian_pde.integrate._compiled_engine import SERIAL_BELOW

    q = np.array([[1.0, 0.3]])
    atts = [gp.Softmax(q, -q, np.eye(2)), gp.Softmax(np.eye(2), np.eye(2), np.eye(2)),
            gp.Softmax(q, q, -np.eye(2))]
    covs = np.array([random_spd(rng, 2) for _ in atts])
    kw = dict(t_eval=np.geomspace(1e-2, 1e3, 7), steady_tol=1e-3)
    assert len(atts) < SERIAL_BELOW
    for order in ([0, 1, 2], [2, 1, 0]):
        together = gp.solve_batch([atts[b] for b in order], covs[order], (0.0, 1e3), **kw)
        for i, b in enumerate(order):
            alone = gp.solve_batch(atts[b], covs[b][None], (0.0, 1e3), **kw)
            np.testing.assert_array_equal(alone.cov[0], together.cov[i])
            np.testing.assert_array_equal(alone.t_final[0], together.t_final[i])
            assert alone.nfev[0] == together.nfev[i]
            assert str(alone.status[0]) == str(together.status[i])
    assert {str(s) for s in together.status} >= {"steady", "blowup"}


def _compiled_heads(d, rng):
    """An example of every registered single-head type that supplies a compiled field."""
    from gaussian_pde.attention import names_with

    heads = [gp.ATTENTIONS[name].example(d, rng)
             for name in names_with(gaussian_preserving=True)
             if issubclass(gp.ATTENTIONS[name], gp.SingleHeadAttention)]
    return [h for h in heads if h.compiled_field() is not None]


def _summable(heads):
    """The heads whose compiled fields add up in a sum: all of them (a type's own kernels,
    another package's, are one head of the sum)."""
    return [h for h in heads if h.compiled_field() is not None]


def _compiled_rhs(cf, d, m):
    ws = np.empty(cf.ws_size)

    def field(Zp):
        out = np.empty(d * m)
        cf.rhs(cf.params, d, m, np.ascontiguousarray(Zp, dtype=float).ravel(), out, ws)
        return out.reshape(d, m)
    return field


def test_compiled_field_is_the_types_moment_equations(rng):
    """Every compiled field, of each registered type and of a sum of two, against the
    type's own moment equations: ``Z' = [M(alpha, Sigma) L | alpha']`` at ``Z = [L | alpha]``."""
    d = 3
    heads = _compiled_heads(d, rng)
    assert len(heads) >= 4
    packed = _summable(heads)
    for att in heads + [gp.MultiHead(packed[i:i + 2]) for i in range(len(packed) - 1)]:
        cf = att.compiled_field()
        L = rng.standard_normal((d, d)) / 2
        mean = rng.standard_normal(d)
        cov = L @ L.T
        got = _compiled_rhs(cf, d, d + 1)(np.column_stack([L, mean]))
        dmean, _ = gp.moment_rhs(att, mean, cov)
        M = att.field_matrix_with_mean(cov, mean)
        np.testing.assert_allclose(got[:, :d], M @ L, rtol=1e-12, atol=1e-12, err_msg=repr(att))
        np.testing.assert_allclose(got[:, d], dmean, rtol=1e-12, atol=1e-12, err_msg=repr(att))
        if not att.field_sees_mean:
            np.testing.assert_allclose(_compiled_rhs(cf, d, d)(L), att.factor_rhs(L),
                                       rtol=1e-12, atol=1e-12, err_msg=repr(att))


def test_compiled_jacobian_against_central_differences(rng):
    """The closed-form Jacobian kernel (every compiled field that has one, alone and in a
    sum of heads, with and without the mean) against central differences of the field."""
    from gaussian_pde._common.differences import central_jacobian

    d = 3
    heads = _compiled_heads(d, rng)
    exact = [h for h in _summable(heads) if h.compiled_field().exact_jacobian]
    assert len(exact) >= 3
    for att in exact + [gp.MultiHead(exact[i:i + 2]) for i in range(len(exact) - 1)]:
        cf = att.compiled_field()
        assert cf.exact_jacobian
        for m in (d, d + 1):
            Z = rng.standard_normal((d, m))
            field = _compiled_rhs(cf, d, m)
            J = np.empty((d * m, d * m))
            assert cf.jac(cf.params, d, m, Z.ravel(), J, np.empty(cf.ws_size))
            ref = central_jacobian(field, Z)
            np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max(),
                                       err_msg=repr(att))
    # a field without a closed form says so: the integrator then takes differences
    for att in heads:
        cf = att.compiled_field()
        if not cf.exact_jacobian:
            J = np.empty((d * d + d, d * d + d))
            Z = rng.standard_normal((d, d + 1))
            assert not cf.jac(cf.params, d, d + 1, Z.ravel(), J, np.empty(cf.ws_size))


def test_compiled_jacobian_equals_the_complex_step(rng):
    """The closed-form Jacobian kernel (softmax and L2, K = -Q and general, one group and a
    multi-head mix) against the complex step of the attention's NumPy ``factor_rhs``
    (analytic in L: exact to rounding, Squire and Trapp 1998), and the column-scaled
    central differences (error near eps^(2/3)) against the same."""
    from gaussian_pde._common.differences import central_jacobian

    d, n = 3, 9
    Qs, Vs = rng.standard_normal((3, 1, d)), rng.standard_normal((3, d, d))
    atts = [cls(Q, -Q, V) for Q, V in zip(Qs, Vs) for cls in (gp.Softmax, gp.L2)]
    K2, Q2 = rng.standard_normal((2, 2, d))
    atts += [gp.Softmax(Q2, K2, Vs[0]), gp.L2(Q2, K2, Vs[1], scale=0.3),
             gp.MultiHead([gp.Softmax(Q2[:1], K2[:1], Vs[2]), gp.L2(Q2[1:], K2[1:], Vs[0])])]
    for att in atts:
        cf = att.compiled_field()
        L = rng.standard_normal((d, d))
        J = np.empty((n, n))
        assert cf.jac(cf.params, d, d, L.ravel(), J, np.empty(cf.ws_size)), att
        delta = 1e-30 * np.abs(L).max()
        J_cs = np.empty((n, n))
        for j in range(n):
            E = np.zeros(n, dtype=complex)
            E[j] = 1j * delta
            J_cs[:, j] = att.factor_rhs(L + E.reshape(d, d)).imag.ravel() / delta
        np.testing.assert_allclose(J, J_cs, rtol=0, atol=1e-12 * np.abs(J_cs).max(),
                                   err_msg=repr(att))
        J_cd = central_jacobian(_compiled_rhs(cf, d, d), L)
        np.testing.assert_allclose(J_cd, J_cs, rtol=0, atol=1e-8 * np.abs(J_cs).max(),
                                   err_msg=repr(att))
        # a column by hand: a forward difference with a small step
        e = np.zeros((d, d))
        e[1, 1] = 1e-7
        col = (att.factor_rhs(L + e) - att.factor_rhs(L)).ravel() / 1e-7
        np.testing.assert_allclose(J_cs[:, 4], col, rtol=0, atol=1e-5 * np.abs(col).max())


def test_every_compiled_type_batches_with_a_mean_like_solve(rng, monkeypatch):
    """solve_batch (compiled, generic and shape-compiled kernels) against solve, for every
    type with a compiled field and for a sum of two different ones."""
    from gaussian_pde.integrate import _compiled_engine as cb

    d = 3
    heads = _compiled_heads(d, rng)
    packed = _summable(heads)
    atts = heads + [gp.MultiHead([packed[-1], packed[-2]])]
    covs = np.array([random_spd(rng, d) / 4 for _ in atts])
    means = rng.standard_normal((len(atts), d)) / 2
    t_eval = np.linspace(0.0, 0.4, 3)
    sol = gp.solve_batch(atts, covs, (0.0, 0.4), mean0s=means, t_eval=t_eval)
    assert sol.path == "compiled"
    for b, att in enumerate(atts):
        ref = gp.solve(att, means[b], covs[b], (0.0, 0.4), t_eval=t_eval, rtol=1e-12,
                       atol=1e-14)
        assert str(sol.status[b]) == str(ref.status) == "finished", repr(att)
        np.testing.assert_allclose(sol.mean[b], ref.mean, rtol=1e-8, atol=1e-10,
                                   err_msg=repr(att))
        np.testing.assert_allclose(sol.cov[b], ref.cov, rtol=1e-8, atol=1e-10,
                                   err_msg=repr(att))
        # a batch large enough for the kernel compiled for its shape: the same trajectory
        # as a batch of one (the generic kernel; a batch of several types keeps the mean
        # in its own units where one of them is not homogeneous in it, which moves the
        # last digits)
        one = gp.solve_batch(att, covs[b:b + 1], (0.0, 0.4), mean0s=means[b:b + 1])
        monkeypatch.setattr(cb, "SPECIALISE_FROM", 16)     # (a small batch suffices)
        many = gp.solve_batch(att, np.repeat(covs[b:b + 1], cb.SPECIALISE_FROM, 0), (0.0, 0.4),
                              mean0s=np.repeat(means[b:b + 1], cb.SPECIALISE_FROM, 0))
        np.testing.assert_allclose(many.mean_final, np.repeat(one.mean_final,
                                   cb.SPECIALISE_FROM, 0), rtol=1e-12, atol=1e-14)


def test_path_input_and_types_without_a_compiled_field(rng):
    att = gp.Softmax.example(2, rng)
    covs = np.array([np.eye(2)])
    with pytest.raises(ValueError, match="`path`"):
        gp.solve_batch(att, covs, (0, 1), path="fast")
    with pytest.raises(ValueError, match="`path='numpy'` was removed"):
        gp.solve_batch(att, covs, (0, 1), path="numpy")
    with pytest.raises(ValueError, match="`mean0s`"):
        gp.solve_batch(att, covs, (0, 1), mean0s=np.zeros((2, 2)))
    assert gp.solve_batch(att, covs, (0, 1), path="compiled").path == "compiled"

    class NoKernel(gp.Softmax):      # a type without a compiled field
        def compiled_field(self):
            return None

    plain = NoKernel(att.Q, att.K, att.V, att.scale)
    for path in ("auto", "compiled"):
        with pytest.raises(TypeError, match=r"`attentions_or_weights` is NoKernel.*compiled field"):
            gp.solve_batch(plain, covs, (0, 1), path=path)
    with pytest.raises(TypeError, match=r"`attentions_or_weights\[1\]` is NoKernel"):
        gp.solve_batch([att, plain], np.repeat(covs, 2, 0), (0, 1))
    # stacked weights become one attention per row: the same bits as those attentions
    Qs = rng.standard_normal((3, 1, 2))
    w = {"kind": "softmax", "Q": Qs, "K": -Qs, "V": np.stack([np.eye(2)] * 3)}
    a = gp.solve_batch(w, np.repeat(covs, 3, 0), (0, 1))
    b = gp.solve_batch([gp.Softmax(Q, -Q, np.eye(2)) for Q in Qs], np.repeat(covs, 3, 0),
                       (0, 1))
    assert a.path == "compiled"
    np.testing.assert_array_equal(a.cov_final, b.cov_final)
    np.testing.assert_array_equal(a.nfev, b.nfev)


def _single_compiled_names():
    from gaussian_pde.attention import has_hook, names_with

    # the types whose fields this package compiles (a kernel per shape too)
    return [name for name in names_with(gaussian_preserving=True)
            if issubclass(gp.ATTENTIONS[name], gp.SingleHeadAttention)
            and has_hook(gp.ATTENTIONS[name], "compiled_field")
            and gp.ATTENTIONS[name].example(2, 0).compiled_field().heads]


@pytest.mark.parametrize("kind", _single_compiled_names())
def test_kernels_compiled_for_the_shape_give_the_generic_bits(rng, kind, monkeypatch):
    """A large batch runs its type's kernel compiled for its d and k: the same
    operations in the same order as the generic kernel, so the same states, steps,
    evaluations and statuses, bit for bit (with a mean too). A type whose body is
    called rather than inlined (it allocates) keeps the generic kernel."""
    from gaussian_pde.integrate import _compiled_engine as cb

    d, k = 3, 2
    cls = gp.ATTENTIONS[kind]
    atts = [cls(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
                rng.standard_normal((d, d)) / d) for _ in range(6)]
    covs = np.array([random_spd(rng, d) for _ in atts])
    mus = rng.standard_normal((len(atts), d))
    monkeypatch.setattr(cb, "_DEMAND", collections.Counter())   # the shape not asked yet
    generic = cb.compiled_fields(atts, 1)[0]
    special = cb.compiled_fields(atts, cb.SPECIALISE_FROM)[0]
    called = atts[0].compiled_field().heads[0].counted
    assert (special is generic) == called
    # another shape in the batch: the generic kernel serves both
    mixed = atts + [cls.example(d, rng)]
    assert cb.compiled_fields(mixed, cb.SPECIALISE_FROM)[0] is generic
    # (a field that sees the mean runs with one only)
    for kw in ({"mean0s": mus},) if cls.field_sees_mean else ({}, {"mean0s": mus}):
        runs = []
        for start in (10**9, 1):
            monkeypatch.setattr(cb, "SPECIALISE_FROM", start)
            monkeypatch.setattr(cb, "_DEMAND", collections.Counter())
            runs.append(gp.solve_batch(atts, covs, (0.0, 4.0), t_eval=[1.0, 4.0], **kw))
        a, b = runs
        for name in ("cov_final", "cov", "t_final", "t_blowup", "nfev", "nsteps"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert list(a.status) == list(b.status) and a.message == b.message
        if kw:
            np.testing.assert_array_equal(a.mean_final, b.mean_final)


def test_a_loop_of_solves_takes_the_kernel_of_its_shape(rng, monkeypatch):
    """The solves of one shape count together: from the SPECIALISE_FROM-th trajectory
    asked of a type, d and k in the process, the kernel compiled for them (a batch of
    that many at once too); other shapes and sums of heads keep the generic kernel."""
    from gaussian_pde.integrate import _compiled_engine as cb

    monkeypatch.setattr(cb, "_DEMAND", collections.Counter())
    monkeypatch.setattr(cb, "SPECIALISE_FROM", 5)
    att = gp.Softmax.example(3, rng)
    generic = att.compiled_field().rhs
    kernels = [cb.compiled_fields(att)[0] for _ in range(6)]
    assert kernels[:4] == [generic] * 4
    assert kernels[4] is kernels[5] is att.compiled_field().specialised().rhs
    other = gp.Softmax.example(4, rng)
    assert cb.compiled_fields(other)[0] is generic
    assert cb.compiled_fields([other] * 5, 5)[0] is not generic
    two = gp.MultiHead([gp.Softmax.example(3, rng), gp.Softmax.example(3, rng)])
    summed = two.compiled_field().rhs
    assert all(cb.compiled_fields(two)[0] is summed for _ in range(6))


def _python(code, *args, **env):
    """The standard output of ``python -c code args`` in a new process, from the repository root."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=True, env=dict(os.environ, **env),
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))).stdout


_CACHED = """
import gaussian_pde as gp
from gaussian_pde.attention import _compiled_fields as cf
rhs = cf._shape_rhs(gp.Softmax.example(2, 0).compiled_field().heads[0], 2, 3)
print(sum(rhs.stats.cache_hits.values()), sum(rhs.stats.cache_misses.values()))
"""


_PIECES_CACHED = """
from gaussian_pde.integrate import _compiled_engine as cb
drive, fns = cb._core()
disps = [drive] + [cb._function(name) for name in cb._PIECES]
print(sum(sum(d.stats.cache_misses.values()) for d in disps),
      sum(sum(d.stats.cache_hits.values()) for d in disps),
      max(len(d.signatures) for d in disps), int((fns > 0).all()))
"""


def test_the_integrators_pieces_are_compiled_once_and_loaded_from_the_disk_cache():
    """Each large piece of the compiled integrator is compiled once, for one signature,
    into an entry of its own in Numba's disk cache, and the driver's table holds its
    address: a second process loads every piece and compiles none."""
    from gaussian_pde.integrate import _compiled_engine as cb

    _python(_PIECES_CACHED)
    misses, hits, signatures, addressed = _python(_PIECES_CACHED).split()
    assert (misses, hits, signatures, addressed) == ("0", str(len(cb._PIECES) + 1), "1", "1")


_ONE_SIGNATURE = """
from gaussian_pde.integrate import _compiled_engine as cb
cb._core()
print(" ".join(f"{name}:{len(cb._function(name).signatures)}" for name in cb._HELPERS
               if name not in cb._INLINED))
"""


@pytest.mark.slow
def test_every_helper_of_the_integrator_is_compiled_for_one_signature(tmp_path):
    """On a fresh machine (an empty cache) each helper the pieces call by name is compiled
    once: a constant argument (an event's kind, a slot) would make Numba compile one
    specialisation per constant, each linked into its caller, seconds of a cold start."""
    counts = dict(item.split(":") for item in
                  _python(_ONE_SIGNATURE, NUMBA_CACHE_DIR=str(tmp_path)).split())
    assert counts and set(counts.values()) == {"1"}, counts


def test_kernels_of_a_shape_are_loaded_from_the_disk_cache():
    """A shape's kernel is compiled once on a machine: a second process loads it from
    Numba's cache (under a name that carries its shape and a digest of its sources)."""
    runs = [_python(_CACHED).split() for _ in range(2)]
    assert runs[1] == ["1", "0"], runs


def test_kernels_passed_by_address_give_the_same_bits(rng, monkeypatch):
    """The drivers take each kernel by the address looked up once (Numba's wrapper-address
    protocol) or, where that lookup is not available, as the dispatcher itself: the
    same code runs, so the same bits, serial (one trajectory) and parallel."""
    from gaussian_pde.integrate import _compiled_engine as cb

    atts, covs = _settings(rng, 3)
    by_address = [gp.solve_batch(atts[0], covs[:1], (0.0, 2.0)),
                  gp.solve_batch(atts, covs, (0.0, 2.0))]
    rhs = atts[0].compiled_field().rhs
    first = cb._resolved(rhs, 0)
    assert first is cb._resolved(rhs, 0)     # looked up once
    assert isinstance(first.__wrapper_address__(), int) and first.__wrapper_address__() > 0
    monkeypatch.setattr(cb, "_resolved", lambda kernel, which: kernel)
    as_dispatcher = [gp.solve_batch(atts[0], covs[:1], (0.0, 2.0)),
                     gp.solve_batch(atts, covs, (0.0, 2.0))]
    for a, b in zip(by_address, as_dispatcher):
        assert a.path == b.path == "compiled"
        np.testing.assert_array_equal(a.cov_final, b.cov_final)
        np.testing.assert_array_equal(a.nfev, b.nfev)
        np.testing.assert_array_equal(a.status.astype(str), b.status.astype(str))


_BALANCE = r'''
import gc, sys
import numba
import numpy as np
from numba.core.runtime import rtsys
import gaussian_pde as gp
from tests.integrate.test_batch import _stiff_settings

def counts():
    gc.collect()
    s = rtsys.get_allocation_stats()
    return np.array([s.alloc - s.free, s.mi_alloc - s.mi_free])

def work():
    rng = np.random.default_rng(5)
    d = 3
    for name in sys.argv[1:]:
        cls = gp.ATTENTIONS[name]
        atts = [cls.example(d, rng) for _ in range(6)]
        covs = np.array([np.eye(d) + 0.1 * (i % 3) * np.ones((d, d)) for i in range(6)])
        mus = rng.standard_normal((6, d))
        for kw in ({}, {"mean0s": mus}) if not cls.field_sees_mean else ({"mean0s": mus},):
            gp.solve_batch(atts, covs, (0.0, 5.0), t_eval=[1.0, 5.0], steady_tol=1e-3,
                           rank_tol=1e-3, **kw)
            gp.solve(atts[0], kw["mean0s"][0] if kw else None, covs[0], (0.0, 5.0))
    w, covs = _stiff_settings([0, 3])            # RODAS4P2 after the stiffness test
    gp.solve_batch(w, covs, (0.0, 1e3), rtol=1e-8, atol=1e-14, max_nfev=None)
    blow = gp.Softmax.example_setting()          # the blow-up look and its restart
    gp.solve(blow["attention"], None, blow["cov0"], (0.0, blow["horizon"]))

work()
before, made = counts(), rtsys.get_allocation_stats().alloc
work()
print("work", *(counts() - before))
print("made", rtsys.get_allocation_stats().alloc - made)

@numba.njit
def fresh(x):
    return x * 2.0

before = counts()
kept = fresh(np.ones(3))     # the counters see an array that is still held
print("held", *(counts() - before))
'''


def test_compiled_code_frees_what_it_allocates():
    """Most of the compiled core runs without Numba's reference counting (the arrays it
    sees belong to its callers). Where that went wrong, memory would leak: over whole
    runs of every compiled type (batch and single, output, events, a stiff hand-over
    to RODAS4P2, a blow-up), every allocation is freed; the counters do see an array that
    is still held."""
    names = [n for n, cls in gp.ATTENTIONS.items() if has_hook(cls, "compiled_field")]
    out = _python(_BALANCE, *names, NUMBA_NRT_STATS="1")
    lines = dict((ln.split()[0], [int(x) for x in ln.split()[1:]]) for ln in out.splitlines())
    assert lines["made"][0] > 1000 and lines["work"] == [0, 0]
    assert lines["held"] == [1, 1]


@pytest.mark.parametrize("options", [
    {},
    {"max_nfev": None, "steady_tol": 1e-6, "rank_tol": 1e-8, "t_eval": [0.0, 1.0]},
    {"rtol": np.float64(1e-7), "atol": 1, "max_step": 0.5, "max_nfev": np.int32(900),
     "blowup_threshold": 1e4, "steady_atol": 1e-9},
])
def test_core_options_reach_the_driver_by_name_and_type(options):
    """The driver's options: each field holds its solver option (the offs as documented),
    and the Numba type of any set of them is the driver's explicit signature's, so every
    call dispatches to the one compiled driver without converting."""
    import inspect

    import numba

    from gaussian_pde.integrate import _compiled_engine as cb
    from gaussian_pde.integrate._options import solver_options

    opts = solver_options((0.0, 2.0), **options)
    ev = opts.events
    opt = cb._core_options(opts, "rosenbrock", 17)
    assert (opt.atol, opt.rtol, opt.max_step, opt.t0, opt.t1) == (
        opts.atol, opts.rtol, opts.max_step, 0.0, 2.0)
    assert opt.blowup_threshold == ev.blowup_threshold
    assert opt.steady_on == ev.steady_on
    assert opt.steady_tol == (0.0 if ev.steady_tol is None else ev.steady_tol)
    assert opt.steady_atol == ev.steady_atol
    assert opt.rank_tol == (-1.0 if ev.rank_tol is None else ev.rank_tol)
    assert opt.max_nfev == (-1 if opts.max_nfev is None else opts.max_nfev)
    assert (opt.method, opt.ws_size) == (2, 17)
    drive, _ = cb._core()
    (sig,) = drive.signatures
    at = list(inspect.signature(cb._drive).parameters).index("opt")
    assert numba.typeof(opt) == sig[at]


def test_the_switch_time_has_a_slot_of_its_own():
    """A run that stops reads the stop's slots and where RODAS4P2 took over; a single
    trajectory's blow-up crossings follow the batch's slots: no two share a place."""
    from gaussian_pde.integrate import _compiled_engine as cb

    look = {cb.F_TSTAR, cb.F_T_LOOK, cb.F_LIMIT, cb.F_S0, cb.F_S1, cb.F_FINITE}
    stop = {cb.F_T, cb.F_T_BLOWUP, cb.F_T_STOP, cb.F_T_NEXT}
    assert cb.F_STIFF_FROM not in look | stop
    assert cb.F_STIFF_FROM < cb.F_SIZE <= cb.F_NCROSS < cb.F_CROSS
    assert cb.F_CROSS + cb.MAX_CROSSINGS <= cb.F_NGAPS < cb.F_GAP_TIMES


def test_a_fields_event_times_are_kept_and_counted_past_the_room():
    """The times of a field's own events go after the blow-up crossings' room; their count
    goes on past the row's room (``integrate_one`` then runs the trajectory again with
    more), and a batch's row, which has no such place, is left alone."""
    from gaussian_pde.integrate import _compiled_engine as cb

    note = getattr(cb._note, "py_func", cb._note)
    fres = np.zeros(cb.F_GAP_TIMES + 2)
    for t in (0.5, 1.5, 2.5):
        note(fres, cb.F_NGAPS, fres.size, t)
    note(fres, cb.F_NCROSS, cb.F_CROSS + cb.MAX_CROSSINGS, 4.5)     # a blow-up crossing
    assert fres[cb.F_NGAPS] == 3 and fres[cb.F_NCROSS] == 1 and fres[cb.F_CROSS] == 4.5
    np.testing.assert_array_equal(fres[cb.F_GAP_TIMES:], [0.5, 1.5])
    batch_row = np.zeros(cb.F_SIZE)
    note(batch_row, cb.F_NGAPS, batch_row.size, 0.5)
    note(batch_row, cb.F_NCROSS, cb.F_CROSS + cb.MAX_CROSSINGS, 0.5)
    assert not batch_row.any()


#: softmax at d = 2 with large weights (a draw of ``tests/integrate/test_invariants.py``,
#: digits as drawn): the trace grows like e^{8.5e6 t} while a stiff eigenvalue of the
#: Jacobian runs from -1e10 to -5e12 on the span, and Hairer's estimate of h|lambda| on
#: DOP853's steps stays at 1.5 to 3.3, so his test never fires
_CRAWL = dict(
    Q=np.array([[0.0, 0.0], [-19.284402134171327, 429.2369925408704]]),
    K=np.array([[-314.0042803754854, 0.0], [-296.3414280031349, 0.0]]),
    V=np.array([[0.20980940367895642, 0.00924661550972892],
                [-0.4306775901682963, 0.34261600580115015]]),
    cov0=np.array([[38.96732126702816, -57.625785470212186],
                   [-57.625785470212186, 100.84833725204943]]),
    t1=1.16061993706597e-06)


def test_the_second_stiffness_test_finishes_a_crawling_run():
    """DOP853 crawls at its stability limit on ``_CRAWL`` and Hairer's test never fires:
    the second test hands over to RODAS4P2 (the closed form holds), which finishes well
    within the budget and agrees with Radau at a tight tolerance; without a closed form
    (a Rosenbrock step would cost 2n + 6 evaluations) it does not switch, and DOP853
    gives up at the budget."""
    import dataclasses

    from gaussian_pde.attention import _compiled_fields as cf

    att = gp.Softmax(_CRAWL["Q"], _CRAWL["K"], _CRAWL["V"], scale=1 / np.sqrt(2))
    cov0, t1, budget = _CRAWL["cov0"], _CRAWL["t1"], 50_000
    b = gp.solve_batch(att, cov0[None], (0.0, t1), max_nfev=budget)
    assert b.status[0] == "finished" and b.implicit[0] and b.nfev[0] < budget / 2
    s = gp.solve(att, None, cov0, (0.0, t1), max_nfev=budget)
    assert s.status == "finished" and "on: RODAS4P2" in s.message
    ref = gp.solve(att, None, cov0, (0.0, t1), method="Radau", rtol=1e-12, atol=1e-14)
    err = np.linalg.norm(b.cov_final[0] - ref.cov_final) / np.linalg.norm(ref.cov_final)
    assert err < 1e-9, err                     # seen: 3e-11 at the default rtol 1e-10
    field = att.compiled_field()
    bare = dataclasses.replace(field, jac=cf._no_jacobian_kernel(), exact_jacobian=False)
    no_closed_form = type("NoClosedForm", (gp.Softmax,), {"compiled_field": lambda self: bare})(
        att.Q, att.K, att.V, scale=att.scale)
    c = gp.solve_batch(no_closed_form, cov0[None], (0.0, t1), max_nfev=budget)
    assert c.status[0] == "failed" and not c.implicit[0]


def test_a_shape_in_the_disk_cache_is_taken_from_fewer_trajectories(rng, monkeypatch):
    """Between SPECIALISE_CACHED_FROM and SPECIALISE_FROM trajectories a shape takes its
    kernel only where Numba's disk cache holds it (loaded, not compiled); once compiled
    (and so written to the cache) the probe finds it."""
    from gaussian_pde.attention import _compiled_fields as cf
    from gaussian_pde.integrate import _compiled_engine as cb

    att = gp.Softmax.example(3, rng)
    field = att.compiled_field()
    head, k = field.heads[0], int(field.params[2])
    special = field.specialised().rhs            # compiled (or loaded): now on disk
    cf._shape_cached.cache_clear()
    assert cf._shape_cached(head, 3, k)
    assert field.specialised(compile=False).rhs is special
    n = cb.SPECIALISE_CACHED_FROM
    monkeypatch.setattr(cb, "_DEMAND", collections.Counter())
    assert cb.compiled_fields(att, n - 1)[0] is field.rhs
    assert cb.compiled_fields(att, 1)[0] is special
    # a shape not in the cache: the generic kernel until SPECIALISE_FROM
    monkeypatch.setattr(cf, "_shape_cached", lambda *shape: False)
    monkeypatch.setattr(cb, "_DEMAND", collections.Counter())
    assert cb.compiled_fields(att, cb.SPECIALISE_FROM - 1)[0] is field.rhs
    assert cb.compiled_fields(att, 1)[0] is special


def test_a_fields_events_need_their_room_in_its_scratch():
    """A field that declares too little scratch for its measures and events is refused
    before any call (its kernel would write past the scratch)."""
    from gaussian_pde.closure import _mixture_field as mf
    from gaussian_pde.integrate import _compiled_engine as cb
    from gaussian_pde.integrate._options import solver_options

    K, d = 3, 2
    y0 = np.zeros(K * (d + d * d))
    short = (*mf.kernels(), np.zeros((1, 8)), mf.ws_size(d, K))    # no room for the events
    with pytest.raises(ValueError, match=r"`fields` declares .* fewer than the measures and 2 "
                                         r"events need"):
        cb.integrate_one(short, y0, y0.size, 1, 1.0, d, solver_options((0.0, 1.0)),
                         cov=(d, K * (d + 1)), gaps=(K - 1, False, "merge"))
