# ruff: noqa: NPY002  (the published 2d_plots.py draws from the legacy global generator)
"""The 2-D regimes of the published 2d_plots.py (gaussian_pde.studies._regimes).

Checked: the draws equal NumPy's legacy generator consumed in the script's order, the
package's fields equal a transcription of the script's right-hand sides, the script's
grid, and that every panel shows the outcomes its family claims with few undecided.
"""

import numpy as np
import pytest
import scipy.linalg

from gaussian_pde.analysis import Outcome
from gaussian_pde.studies import _regimes as R


def _legacy_draws():
    # the script's own calls on the global legacy generator
    state = np.random.get_state()
    try:
        np.random.seed(35)
        Qz = np.random.rand(2, 2)
        V = np.random.randn(2, 2)
        Vz = V @ V.T
        np.random.seed(36)
        q = np.random.randn(1, 2)
        q = q / np.linalg.norm(q)

        def loop(seed, test):
            np.random.seed(seed)
            for _ in range(1000):
                Q, K = np.random.randn(2, 2), np.random.randn(2, 2)
                A = K.T @ Q
                e = np.linalg.eigh(A + A.T)[0]
                if test(e):
                    break
            return Q, K

        Qt, Kt = loop(36, lambda e: e[0] * e[1] < 0)
        np.random.seed(32)
        Vt = np.random.randn(2, 2)
        Qb, Kb = loop(33, lambda e: e[0] > 0)
        np.random.seed(35)
        np.random.randn(8, 7)
        Vd = np.random.randn(2, 2)
    finally:
        np.random.set_state(state)
    return dict(Qz=Qz, Vz=Vz, q=q, Qt=Qt, Kt=Kt, Vt=Vt, Qb=Qb, Kb=Kb, Vd=Vd)


def test_draws_match_the_legacy_generator():
    ref, w = _legacy_draws(), R.published_weights()
    np.testing.assert_array_equal(w["zero"]["Q"], ref["Qz"])
    np.testing.assert_array_equal(w["zero"]["V"], ref["Vz"])
    np.testing.assert_array_equal(w["line"]["q"], ref["q"])
    assert abs(float(w["line"]["q"].ravel() @ w["line"]["direction"])) < 1e-12
    for fam, V in (("two_lines", "Vt"), ("depends", "Vd")):
        np.testing.assert_array_equal(w[fam]["Q"], ref["Qt"])
        np.testing.assert_array_equal(w[fam]["K"], ref["Kt"])
        np.testing.assert_array_equal(w[fam]["V"], ref[V])
    np.testing.assert_array_equal(w["blowup"]["Q"], ref["Qb"])
    np.testing.assert_array_equal(w["blowup"]["K"], ref["Kb"])


# transcriptions of the script's right-hand sides (d = 2)
def _trad(S, Q, K, V):
    A = K.T @ Q / np.sqrt(2)
    r = V @ S @ A @ S
    return r + r.T


def _l2(S, Q, K, V):
    A = K.T @ Q / np.sqrt(2)
    r = 2 * V @ S @ np.linalg.inv(np.eye(2) + 2 * K.T @ K @ S) @ A @ S
    return r + r.T


def _mh(S, Q, K, V, H):
    k, r = 2 // H, 0
    for h in range(H):
        A = K[k * h:k * (h + 1)].T @ Q[k * h:k * (h + 1)] / np.sqrt(k)
        r = r + np.eye(2)[k * h:k * (h + 1)].T @ V[k * h:k * (h + 1)] @ S @ A @ S
    return r + r.T


def _sink(S, Q, K, V):
    Ss = scipy.linalg.sqrtm(S).real
    A = K.T @ Q
    P = Ss @ A.T
    C = 0.5 * (Ss @ scipy.linalg.sqrtm(4 * P @ S @ P.T + np.eye(2)).real
               @ np.linalg.pinv(Ss) - np.eye(2))
    r = V @ np.linalg.pinv(A.T) @ np.linalg.pinv(S) @ C @ S
    return r + r.T


def test_fields_match_the_script():
    w, I2 = R.published_weights(), np.eye(2)
    q = w["line"]["q"]
    Qz, Vz = w["zero"]["Q"], w["zero"]["V"]
    ref = {
        "zero": dict(softmax=(_trad, Qz, -Qz, Vz), l2=(_l2, Qz, -Qz, Vz),
                     multihead=(_mh, Qz, -Qz, Vz, 2), sinkhorn=(_sink, Qz, -Qz, Vz)),
        "line": dict(softmax=(_trad, q, -q, I2), l2=(_l2, q, -q, I2)),
        "plane": dict(multihead=(_mh, q, -q, I2, 2)),
    }
    for fam in ("two_lines", "blowup", "depends"):
        Q, K = w[fam]["Q"], w[fam]["K"]
        V = w[fam].get("V", I2)
        ref[fam] = dict(softmax=(_trad, Q, K, V), l2=(_l2, Q, K, V),
                        multihead=(_mh, Q, K, V, 1 if fam == "depends" else 2),
                        sinkhorn=(_sink, Q, K, V))
    rng = np.random.default_rng(0)
    for fam, atts in R.draw_all().items():
        assert tuple(atts) == R.PANELS[fam]
        for name, (att, _) in atts.items():
            f, *args = ref[fam][name]
            for _ in range(3):
                G = rng.standard_normal((2, 2))
                S = G @ G.T + 0.1 * np.eye(2)
                np.testing.assert_allclose(att.cov_rhs(S), f(S, *args), rtol=1e-10,
                                           atol=1e-12, err_msg=f"{fam}/{name}")


def test_published_grid_is_init_grid():
    # the script's init_grid(n, n, 1, limits): meshgrid(U, C, V).T order, strict disk
    for n, lim in ((10, 0.5), (40, 1.0)):
        U = np.linspace(-lim, lim, n)
        X = np.array(np.meshgrid(U, U, [1.0])).T.reshape(-1, 3)
        ref = [np.array([[(u + v) / 2, w / 2], [w / 2, (v - u) / 2]])
               for u, w, v in X if v ** 2 - u ** 2 > w ** 2]
        np.testing.assert_allclose(R.published_grid(n, lim), np.array(ref), atol=1e-15)
    g = R.regime_grids("published")
    assert len(g["zero"]) == 100 and len(g["blowup"]) > 1000
    with pytest.raises(ValueError, match="size"):
        R.regime_grids("huge")


def _undecided(oc):
    return sum(o.outcome == Outcome.UNDECIDED for o in oc)


def _unconfined(att):
    """Whether every head's score is linear in the key token (a quadratic score without a
    Hessian ``H`` to confine it): such a field can blow up; the others only grow."""
    scores = [h.quadratic_score() for h in att.heads]
    return all(s is not None and s.H is None for s in scores)


def _check_panels(res):
    w = R.published_weights()
    for (fam, name), r in res.items():
        oc = r["outcomes"]
        kinds = {str(o.outcome) for o in oc} - {"undecided"}
        assert _undecided(oc) < 0.1 * len(oc), (fam, name)
        oc = [o for o in oc if o.outcome != Outcome.UNDECIDED]
        if fam == "zero":
            assert kinds == {"zero"}, (fam, name)
        elif fam in ("line", "two_lines"):
            assert kinds == {"rank"} and {o.rank for o in oc} == {1}, (fam, name)
        elif fam == "plane":
            assert kinds == {"rank"} and {o.rank for o in oc} == {2}
            q = w["line"]["q"].ravel()
            for o in oc:     # the steady states e_1^T Sigma q = 0: a plane of the cone
                assert abs(o.limit[0] @ q) < 1e-6 * np.trace(o.limit)
        elif fam == "blowup":
            want = "blowup" if _unconfined(r["attention"]) else "grows"
            assert kinds == {want}, (fam, name)
        elif fam == "depends" and _unconfined(r["attention"]):
            assert {"blowup", "rank"} <= kinds, (fam, name)     # two fates
    # the line: the limit is fixed by the conserved n^T Sigma^-1 n (docs/math.md 4.2)
    n = w["line"]["direction"]
    for name in R.PANELS["line"]:
        r = res[("line", name)]
        for cov0, o in zip(r["covs"][:, 0], r["outcomes"]):
            pred = np.outer(n, n) / (n @ np.linalg.solve(cov0, n))
            np.testing.assert_allclose(o.limit, pred, atol=1e-3 * np.trace(pred))
    for name in R.PANELS["two_lines"]:
        assert len(R.limit_lines(res[("two_lines", name)]["outcomes"])) == 2
    # a "depends" field that is a sum of one head (the script's multi-head one) gives the
    # outcomes of that head's own panel
    depends = {name: r for (fam, name), r in res.items() if fam == "depends"}
    pairs = [(name, other) for name, r in depends.items()
             for other, r2 in depends.items()
             if r["attention"].heads != (r["attention"],)
             and r["attention"].heads == (r2["attention"],)]
    assert pairs
    for name, other in pairs:
        assert ([str(o.outcome) for o in depends[name]["outcomes"]]
                == [str(o.outcome) for o in depends[other]["outcomes"]]), (name, other)


@pytest.fixture(scope="module")
def quick():
    return R._run_regimes(R.regime_grids("quick"), 10)


def test_quick_panels_show_their_outcomes(quick):
    assert set(quick) == {(f, n) for f in R.FAMILIES for n in R.PANELS[f]}
    _check_panels(quick)


@pytest.mark.slow
def test_default_and_published_grids():
    for size in ("default", "published"):
        _check_panels(R._run_regimes(R.regime_grids(size), 10))
