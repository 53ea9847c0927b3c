"""Model specifications, tasks and their reference losses, bad input (no JAX needed)."""

import math

import numpy as np
import pytest

from gaussian_pde.training import TASKS, VARIANTS, ModelSpec, get_task, model_spec
from gaussian_pde.training._tasks import TEXT_CHARS, text_corpus


def test_variants_names_and_blocks():
    base = {"pre_ln", "post_ln", "peri_ln", "dyt", "ngpt", "rezero", "no_ln", "no_ln_sqrt",
            "no_ln_depth", "no_residual", "neither"}
    sims = {f"pde_{s}{t}{h}" for s in ("euler", "rk4") for t in ("", "_tied")
            for h in ("", "_tL")}
    assert set(VARIANTS) == base | sims
    for name, spec in VARIANTS.items():
        assert spec.name == name
        assert model_spec(name, depth=7).name == name
    assert VARIANTS["pde_rk4"].step == pytest.approx(1.0 / VARIANTS["pde_rk4"].depth)
    assert model_spec("pde_euler_tL", depth=9).step == 1.0
    assert VARIANTS["no_ln"].step == 1.0
    for L in (2, 16, 64):
        assert model_spec("no_ln", depth=L).branch_factor == 1.0
        assert model_spec("no_ln_sqrt", depth=L).branch_factor == pytest.approx(L ** -0.5)
        assert model_spec("no_ln_depth", depth=L).branch_factor == pytest.approx(1.0 / L)
    s = model_spec("no_ln", width=8, heads=2)
    assert s.score_scale == pytest.approx(1 / math.sqrt(4)) and s.name == "no_ln"


@pytest.mark.parametrize("kwargs,word", [
    (dict(depth=0), "`depth`"), (dict(width=6, heads=4), "`width`"),
    (dict(norm="mid"), "`norm`"), (dict(simulator="rk5"), "`simulator`"),
    (dict(horizon=float("nan")), "`horizon`"), (dict(scale=-1.0), "`scale`"),
    (dict(simulator="euler", norm="pre"), "`norm`"), (dict(depth=2.5), "`depth`"),
    (dict(branch_scale="2"), "`branch_scale`"), (dict(rezero=True), "`rezero`"),
    (dict(norm="ngpt", residual=False), "`residual`"), (dict(rezero=1), "`rezero`"),
])
def test_bad_spec(kwargs, word):
    with pytest.raises((ValueError, TypeError), match=word):
        ModelSpec(**kwargs)


def test_bad_names():
    with pytest.raises(ValueError, match="`model`"):
        model_spec("transformer")
    with pytest.raises(ValueError, match="`task`"):
        get_task("sorting")
    with pytest.raises(ValueError, match="`n_tokens`"):
        get_task("mixture", n_tokens=1)
    with pytest.raises(ValueError, match="`split`"):
        TASKS["mixture"].sample(np.random.default_rng(0), 2, split="valid")


def test_tasks_are_seeded_and_have_their_statistics():
    t = TASKS["mixture"]
    x1, y1 = t.batches(3, 2, 500)
    x2, y2 = t.batches(3, 2, 500)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert x1.shape == (2, 500, t.n_tokens, t.input_dim)
    # every class has mean zero; the second moment along m_c is |m_c|^2 + 1 = 3.25
    x, y = x1.reshape(-1, t.n_tokens, t.input_dim), y1.reshape(-1)
    m = t.centres()
    for c in range(t.n_classes):
        xc = x[y == c].reshape(-1, t.input_dim)
        se = 4 / np.sqrt(xc.shape[0])
        assert np.abs(xc.mean(axis=0)).max() < se
        u = m[c] / np.linalg.norm(m[c])
        assert abs(np.mean((xc @ u) ** 2) - 3.25) < 10 * se
    r = TASKS["regression"]
    x, y = r.sample(np.random.default_rng(0), 4000)
    assert x.shape == (4000, r.n_tokens, r.input_dim) and np.all(x[:, -1, -2] == 0)
    assert np.all(x[:, -1, -1] == 1) and np.all(x[:, :-1, -1] == 0)
    # var y = E|w|^2 + sigma^2 = 1 + sigma^2; sd of the sample variance about sqrt(2/n) * var
    assert abs(np.var(y) - r.target_var) < 5 * math.sqrt(2 / 4000) * r.target_var * 2


def _least_squares_and_bayes(task, n, seed):
    """Monte Carlo of the normalised risks of least squares and of the posterior mean."""
    x, y = task.sample(np.random.default_rng(seed), n)
    p = task.input_dim - 2
    X, Y, q = x[:, :-1, :p], x[:, :-1, p], x[:, -1, :p]
    G = np.einsum("bmi,bmj->bij", X, X)
    r = np.einsum("bmi,bm->bi", X, Y)
    w_ls = np.linalg.solve(G, r[..., None])[..., 0]
    w_b = np.linalg.solve(G + task.noise ** 2 * p * np.eye(p), r[..., None])[..., 0]
    e_ls = (y - np.einsum("bi,bi->b", q, w_ls)) ** 2 / task.target_var
    e_b = (y - np.einsum("bi,bi->b", q, w_b)) ** 2 / task.target_var
    return e_ls, e_b


@pytest.mark.parametrize("noise,p,n", [(0.5, 1, 16), (0.1, 3, 16)])
def test_regression_risks_match_monte_carlo(noise, p, n):
    """sigma^2 (1 + p/(m-p-1)) / (1 + sigma^2) against simulated least squares (m = n - 1);
    the Bayes (posterior mean) risk against the simulated posterior mean, and below it."""
    import dataclasses

    task = dataclasses.replace(TASKS["regression"], noise=noise, input_dim=p + 2, n_tokens=n)
    e_ls, e_b = _least_squares_and_bayes(task, 100_000, 1)
    se = e_ls.std() / math.sqrt(e_ls.size)
    assert abs(e_ls.mean() - task.least_squares_risk()) < 4 * se
    # with sigma = 0.1, p = 3, m = 15: 0.01 (1 + 3/11) / 1.01 = 0.0126 (not 0.01 + 3/11)
    if noise == 0.1:
        assert task.least_squares_risk() == pytest.approx(0.01 * (1 + 3 / 11) / 1.01)
    b, b_se = task.bayes_risk(n_samples=50_000, seed=2)
    assert abs(e_b.mean() - b) < 4 * math.hypot(e_b.std() / math.sqrt(e_b.size), b_se)
    assert noise ** 2 / task.target_var < b <= task.least_squares_risk() + 4 * b_se


def test_mixture_bayes_risk_is_the_posterior_cross_entropy():
    """The exact posterior is calibrated: its accuracy equals its mean top probability."""
    t = TASKS["mixture"]
    b, se = t.bayes_risk(n_samples=20_000)
    assert 0 < b < t.chance and se < 0.02
    x, y = t.sample(np.random.default_rng(5), 20_000)
    s = np.einsum("bnp,cp->bnc", x, t.centres())
    ll = np.sum(np.logaddexp(s, -s), axis=1)
    post = np.exp(ll - ll.max(axis=1, keepdims=True))
    post /= post.sum(axis=1, keepdims=True)
    acc = np.mean(np.argmax(post, axis=1) == y)
    assert abs(acc - post.max(axis=1).mean()) < 4 * math.sqrt(0.25 / 20_000)
    assert abs(-np.mean(np.log(post[np.arange(y.size), y])) - b) < 4 * math.hypot(se, se)


def test_text_task_reads_the_standard_library():
    t = TASKS["text"]
    train, test = text_corpus()
    assert train.size > 100_000 and test.size > 10_000
    assert abs(train.size / (train.size + test.size) - 0.9) < 1e-3
    assert t.n_outputs == len(TEXT_CHARS) + 1 and t.input_dim == t.n_outputs + t.n_tokens
    x, y = t.sample(np.random.default_rng(0), 5, split="test")
    assert x.shape == (5, t.n_tokens, t.input_dim)
    # one character and one position per token
    assert np.all(x[..., :t.n_outputs].sum(axis=-1) == 1)
    assert np.all(np.argmax(x[..., t.n_outputs:], axis=-1) == np.arange(t.n_tokens))
    assert 0 < t.bigram_loss() < t.chance < math.log(t.n_outputs)
    t8 = get_task("text", n_tokens=8)
    assert t8.input_dim == t8.n_outputs + 8
