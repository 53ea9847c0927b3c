"""Model specifications, tasks and bad input (no JAX needed)."""

import math

import numpy as np
import pytest

from gaussian_pde.training import TASKS, VARIANTS, ModelSpec, get_task, model_spec


def test_variants_names_and_blocks():
    assert set(VARIANTS) == {"pre_ln", "post_ln", "no_ln", "no_residual", "neither",
                             "pde_euler", "pde_rk4", "pde_euler_tied", "pde_rk4_tied"}
    for name, spec in VARIANTS.items():
        assert spec.name == name
    assert VARIANTS["pde_rk4"].step == pytest.approx(1.0 / VARIANTS["pde_rk4"].depth)
    assert VARIANTS["no_ln"].step == 1.0
    s = model_spec("no_ln", width=8, heads=2)
    assert s.score_scale == pytest.approx(1 / math.sqrt(4)) and s.name == "no_ln"


@pytest.mark.parametrize("kwargs,word", [
    (dict(depth=0), "`depth`"), (dict(width=6, heads=4), "`width`"),
    (dict(norm="mid"), "`norm`"), (dict(simulator="rk5"), "`simulator`"),
    (dict(horizon=float("nan")), "`horizon`"), (dict(scale=-1.0), "`scale`"),
    (dict(simulator="euler", norm="pre"), "`norm`"), (dict(depth=2.5), "`depth`"),
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
    assert abs(np.var(y) - 1.01) < 0.1
