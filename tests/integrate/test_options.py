"""One validation of solver options (integrate/_options.py) for every solver."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.integrate._options import solver_options, validate_method, validate_user_events

I2 = np.eye(2)
ATT = gp.Softmax(I2, I2, I2, scale=0.5)
BAD = [
    ({"rtol": 0.0}, "rtol"),
    ({"atol": -1.0}, "atol"),
    ({"max_step": np.nan}, "max_step"),
    ({"max_step": -np.inf}, "max_step"),
    ({"first_step": 5.0}, "first_step"),
    ({"max_nfev": 0}, "max_nfev"),
    ({"t_eval": [0.5, 0.2]}, "t_eval"),
    ({"blowup_threshold": 0.5}, "blowup_threshold"),
    ({"rank_tol": -0.1}, "rank_tol"),
]


@pytest.mark.parametrize("kwargs, match", BAD)
def test_solver_options_name_the_argument(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        solver_options((0, 1), **kwargs)


@pytest.mark.parametrize("kwargs, match", [(k, m) for k, m in BAD if "first_step" not in k])
def test_every_solver_refuses_the_same_options(kwargs, match):
    """solve, solve_batch, solve_closure and the particles share the checks."""
    calls = [lambda: gp.solve(ATT, None, I2, (0, 1), **kwargs),
             lambda: gp.solve_batch(ATT, I2[None], (0, 1), **kwargs),
             lambda: gp.solve_closure(ATT, np.zeros(2), I2, (0, 1), **kwargs)]
    for call in calls:
        with pytest.raises((TypeError, ValueError), match=match):
            call()


def test_methods_and_events():
    assert validate_method("LSODA") == "LSODA"
    assert validate_method("rosenbrock", extra=("rosenbrock",)) == "rosenbrock"
    with pytest.raises(ValueError, match="`method`"):
        validate_method("euler")
    with pytest.raises(TypeError, match="`method`"):
        validate_method(3)
    ev = validate_user_events(lambda t, m, c: 1.0)
    assert len(ev) == 1
    with pytest.raises(TypeError, match=r"`events\[1\]`"):
        validate_user_events([lambda t, m, c: 1.0, 3])
