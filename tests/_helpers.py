"""Small helpers shared by the tests (import as ``from tests._helpers import ...``)."""

import numpy as np

#: the smallest sweep spec the CLI tests run: two L2 draws in d = 2, five grid points
TINY_SWEEP = """
[sweep]
attention = ["l2"]
dims = [2]
draws = 2
seed = 7
batch_size = 2

[solver]
horizon = 5.0

[record]
grid = 5
"""


def random_spd(rng, d, rank=None):
    """A random PSD matrix of the given rank (full rank by default)."""
    G = rng.standard_normal((d, d if rank is None else rank))
    return G @ G.T


def relative_error(a, b):
    """Frobenius relative error over the last two axes."""
    return np.linalg.norm(np.asarray(a) - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))


def accelerating_sinkhorn_case():
    """A d = 5 Sinkhorn setting whose trace grows like an accelerating exponential.

    Sinkhorn's field is bounded by ``|V| |L|``, so it cannot blow up in finite time; yet
    its trace passes 1e8 x its start at t = 16.8 while the growth rate still rises, where a
    single blow-up estimate says t* = 18.7. Returns ``(attention, cov0)``.
    """
    import gaussian_pde as gp

    Q = np.array([[-0.6872, -0.1816, -0.7537, 0.0091, -1.0375],
                  [0.0231, 0.1946, 1.8339, 1.742, 0.5283]])
    V = np.array([[0.6026, -0.011, -0.6601, -0.2271, 0.0617],
                  [0.441, -0.4285, 0.1381, -0.5096, 0.0551],
                  [-0.5755, -0.1863, -0.6608, -0.4172, -0.6909],
                  [-0.8603, 0.5697, 0.5495, 0.2371, -0.1373],
                  [0.6808, -0.1028, 0.2147, 0.5328, 0.1248]])
    L0 = np.array([[0.8504, 0, 0, 0, 0], [-0.3801, 1.0327, 0, 0, 0],
                   [0.5041, 0.2783, 0.931, 0, 0], [-0.1653, 0.6607, 0.4812, 0.2635, 0],
                   [0.3672, 1.0122, -0.3535, -0.9132, 0.3724]])
    return gp.Sinkhorn(Q, -Q, V), L0 @ L0.T


def run_within(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, failing the test if it has not returned after ``seconds``.

    The call runs in a daemon thread, so a hang fails the test instead of blocking the
    run (the thread is left behind; the process ends with the test session). An
    exception raised by ``fn`` is raised again here.
    """
    import threading

    out = {}

    def target():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not return within "
                             f"{seconds} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def assert_all_finite(sol):
    """Every float array of a solution (dataclass) is finite, and ``t`` strictly increases."""
    import dataclasses

    for f in dataclasses.fields(sol):
        v = getattr(sol, f.name)
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and f.name != "t_blowup":
            assert np.all(np.isfinite(v)), f"`{f.name}` holds inf or NaN"
    t = np.asarray(sol.t)
    assert t.ndim != 1 or np.all(np.diff(t) > 0), "`t` is not strictly increasing"


def head_of(cls, Q, K, V):
    """``cls(Q, K, V)``; a type's further required weights (a type from another package,
    such as key-norm softmax's ``gamma``) are taken from its ``example``."""
    import inspect

    params = list(inspect.signature(cls).parameters.values())[3:]
    extra = {p.name: getattr(cls.example(Q.shape[1], 0), p.name) for p in params
             if p.default is inspect.Parameter.empty
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return cls(Q, K, V, **extra)


def summable(classes):
    """Those of ``classes`` whose compiled fields add up in a sum of heads on the compiled
    path: every type with a compiled field (a type's own kernels, another package's,
    are one head of the sum)."""
    return [cls for cls in classes if cls.example(2, 0).compiled_field() is not None]
