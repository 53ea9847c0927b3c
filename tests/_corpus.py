"""A bad-input corpus over the public entry points, generated systematically.

Every public entry point has a *baseline*: a small valid call, written as keyword
arguments. Every argument of it has a *kind* (``"matrix"``, ``"cov"``, ``"tol"``, ...),
and every kind a list of *bad values*, each a function of the baseline value. A case is
one (entry point, argument, bad value); its expectation is

``"error"``
    the call must raise ``ValueError`` or ``TypeError`` whose message names the argument
    (NaN, inf, complex, a wrong shape or type, an out-of-range option: nothing sensible
    can be computed);
``"either"``
    that error, or a *correct result*: finite (no inf anywhere; NaN only in the fields
    documented as "NaN once a trajectory stopped"), with a status of
    :class:`gaussian_pde.Status` (overflow/underflow scales, d = 1, k < d, rank-deficient
    covariance, a singular interaction matrix: valid input that must not give garbage).

:func:`run_case` runs one case in a forked worker process with a time limit, so a hang
fails its case (with a faulthandler traceback of where it hung) instead of blocking the
suite. The default corpus (:func:`cases`) takes one bad value per kind where the values
only repeat a check; ``cases(full=True)`` is every combination (the slow test).
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import faulthandler
import inspect
import multiprocessing
import os
import sys
import threading
import traceback
import warnings

import numpy as np

import gaussian_pde as gp
from gaussian_pde import analysis
from gaussian_pde.attention import has_hook
from gaussian_pde.sweep import SweepSpec

# --------------------------------------------------------------------------------------
# baselines
# --------------------------------------------------------------------------------------

_RNG_SEED = 20261201


def _weights(d, k=None, seed=0):
    rng = np.random.default_rng(seed)
    k = d if k is None else k
    Q = 0.5 * rng.standard_normal((k, d))
    K = 0.5 * rng.standard_normal((k, d))
    V = rng.standard_normal((d, d)) / np.sqrt(d)
    return Q, K, V


def _softmax(d=2):
    return gp.Softmax(*_weights(d))


def _cov(d=2):
    return np.array([[1.0, 0.3], [0.3, 0.5]]) if d == 2 else np.eye(d)


def _mixture():
    return gp.GaussianMixture([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.0]], [0.3 * np.eye(2)] * 2)


def _particles(n=12, d=2):
    return np.random.default_rng(1).standard_normal((n, d))


def _stack():
    return gp.Stack(gp.Softmax(*_weights(2)), n_layers=3, h=0.1, mode="residual")


def _spec_dict():
    return {"sweep": {"attention": ["softmax"], "dims": [2], "draws": 2, "seed": 1,
                      "batch_size": 2},
            "weights": {"k": "half", "distribution": "normal", "std": 1.0,
                        "key": "minus_query", "value": "identity", "score_scale": 0.0,
                        "heads": 2, "head_type": "softmax"},
            "initial": {"cov": "wishart", "rank": "full", "std": 1.0, "distribution": "normal"},
            "solver": {"horizon": 1.0, "method": "DOP853", "rtol": 1e-8, "atol": 1e-10,
                       "blowup_threshold": 1e8, "steady_tol": 1e-9, "max_nfev": 2000},
            "record": {"final_state": True, "outcome": True, "limit_rank": True,
                       "blowup_time": True, "eigenvalues": True, "grid": 3,
                       "rank_threshold": 1e-2}}


def _from_spec(**tables):
    """``SweepSpec.from_dict`` of the baseline with ``tables = {"table.key": value}`` set."""
    data = _spec_dict()
    for dotted, value in tables.items():
        table, key = dotted.split(".")
        data[table][key] = value
    return SweepSpec.from_dict(data)


def _sweep_entry():
    """``SweepSpec.from_dict`` with one keyword per key, named ``table__key``."""
    def call(**kw):
        return _from_spec(**{k.replace("__", "."): v for k, v in kw.items()})
    return call


@dataclasses.dataclass(frozen=True)
class Entry:
    """One public entry point: the callable, its baseline keywords and argument kinds."""

    func: object
    baseline: object            # () -> dict of keyword arguments (a valid call)
    kinds: dict                 # argument -> kind (a key of BAD)


#: what a single head's constructor argument is (a key of BAD), by its name
_HEAD_KINDS = {"Q": "weight", "K": "weight", "V": "value", "scale": "scale", "bias": "real",
               "q": "opt_vector", "k_b": "opt_vector"}
#: a valid value of each optional argument of ``_HEAD_KINDS``
_HEAD_EXTRA = {"bias": 0.0, "q": np.array([0.3, -0.2]), "k_b": np.array([0.1, 0.4])}


def _attention_entries():
    """Every registered attention type's constructor, its arguments read off its signature;
    a type that sums heads (``from_heads``) is given two single heads."""
    out = {}
    singles = [cls for cls in gp.ATTENTIONS.values()
               if cls.gaussian_preserving and issubclass(cls, gp.SingleHeadAttention)]
    for name, cls in gp.ATTENTIONS.items():
        if has_hook(cls, "from_heads"):
            out[f"{name}()"] = Entry(cls,
                                     lambda: {"heads": [h(*_weights(2)) for h in singles[:2]]},
                                     {"heads": "heads"})
            continue
        params = inspect.signature(cls).parameters
        kinds = {arg: kind for arg, kind in _HEAD_KINDS.items() if arg in params}
        extra = {arg: v for arg, v in _HEAD_EXTRA.items() if arg in params}
        for arg, p in params.items():      # a further real weight (a type of another
            if arg not in kinds and p.default is inspect.Parameter.empty:   # package)
                kinds[arg] = "real"
                extra[arg] = float(getattr(cls.example(2, 0), arg))

        def base(extra=extra):
            Q, K, V = _weights(2)
            return {"Q": Q, "K": K, "V": V, "scale": 0.7, **extra}
        out[f"{name}()"] = Entry(cls, base, kinds)
    return out


SOLVER_KINDS = {"t_span": "t_span", "t_eval": "t_eval", "rtol": "tol", "atol": "pos",
                "blowup_threshold": "threshold", "steady_tol": "opt_pos",
                "steady_atol": "nonneg", "rank_tol": "opt_tol", "max_step": "max_step",
                "max_nfev": "opt_count"}


def entries():
    """name -> :class:`Entry` of every public entry point in the corpus."""
    E = dict(_attention_entries())
    E["moment_rhs"] = Entry(gp.moment_rhs, lambda: {"attention": _softmax(), "mean": np.zeros(2),
                                                    "cov": _cov()},
                            {"attention": "gattention", "mean": "vector", "cov": "cov"})
    E["solve"] = Entry(gp.solve, lambda: {"attention": _softmax(), "mean0": np.ones(2),
                                          "cov0": _cov(), "t_span": (0.0, 0.5)},
                       {"attention": "gattention", "mean0": "opt_vector", "cov0": "cov",
                        **SOLVER_KINDS, "method": "method", "first_step": "opt_pos",
                        "events": "events"})
    E["certified_limit"] = Entry(
        gp.certified_limit,
        lambda: {"attention": gp.Softmax(np.array([[1.0, 0.5]]), np.array([[-1.0, -0.5]]),
                                         np.eye(2)),
                 "cov0": _cov(), "t_max": 1e3},
        {"attention": "gattention", "cov0": "cov", "t_max": "pos", "rtol": "tol"})
    E["certified_limits"] = Entry(
        gp.certified_limits,
        lambda: {"attentions": gp.Softmax(np.array([[1.0, 0.5]]), np.array([[-1.0, -0.5]]),
                                          np.eye(2)),
                 "cov0s": np.stack([_cov(), np.eye(2)]), "t_max": 1e3},
        {"attentions": "batch_attention", "cov0s": "covs", "t_max": "pos", "rtol": "tol"})
    E["solve_batch"] = Entry(gp.solve_batch,
                             lambda: {"attentions_or_weights": _softmax(),
                                      "cov0s": np.stack([_cov(), np.eye(2)]),
                                      "t_span": (0.0, 0.5)},
                             {"attentions_or_weights": "batch_attention", "cov0s": "covs",
                              **SOLVER_KINDS, "method": "batch_method"})
    E["solve_batch[weights]"] = Entry(
        gp.solve_batch,
        lambda: {"attentions_or_weights": dict(zip("QKV", _weights(2)), kind="l2"),
                 "cov0s": np.stack([_cov(), np.eye(2)]), "t_span": (0.0, 0.5)},
        {"attentions_or_weights": "weights_dict"})
    E["sample_gaussian"] = Entry(gp.sample_gaussian,
                                 lambda: {"mean": np.zeros(2), "cov": _cov(), "n": 8, "seed": 0},
                                 {"mean": "vector", "cov": "cov", "n": "count2", "seed": "seed"})
    E["simulate_particles"] = Entry(
        gp.simulate_particles,
        lambda: {"attention": _softmax(), "x0": _particles(), "t_span": (0.0, 0.2)},
        {"attention": "attention", "x0": "particles", "t_span": "t_span", "t_eval": "t_eval",
         "method": "method", "dt": "opt_pos", "rtol": "tol", "atol": "pos",
         "chunk_size": "opt_count", "dtype": "dtype", "blowup_threshold": "threshold",
         "steady_tol": "opt_pos", "rank_tol": "opt_tol", "max_steps": "count",
         "sinkhorn_tol": "opt_tol", "sinkhorn_max_iter": "count", "ess_threshold": "nonneg",
         "keep_positions": "flag", "warn": "flag"})
    E["compare"] = Entry(
        gp.compare,
        lambda: {"attention": _softmax(), "mean0": np.zeros(2), "cov0": _cov(), "n": (10, 20),
                 "seeds": range(1), "t_eval": np.array([0.0, 0.1])},
        {"attention": "attention", "mean0": "vector", "cov0": "cov", "n": "counts",
         "seeds": "seeds", "t_eval": "times", "rtol": "tol", "n_directions": "count",
         "ess_threshold": "nonneg", "ode_rtol": "tol"})
    E.update(_closure_and_analysis_entries())
    return E


def _closure_and_analysis_entries():
    """The closures', exact solutions', analysis' and sweep spec's entries."""
    E = {}
    E["AttentionField()"] = Entry(gp.AttentionField, lambda: {"attention": gp.Sigmoid(*_weights(2))},
                                  {"attention": "closure_attention", "logistic_tol": "tol"})
    E["closure_moment_rhs"] = Entry(
        gp.closure_moment_rhs,
        lambda: {"field": gp.AttentionField(gp.Sigmoid(*_weights(2))), "mean": np.zeros(2),
                 "cov": _cov(), "n_per_dim": 4},
        {"field": "field", "mean": "vector", "cov": "cov", "n_per_dim": "quadrature"})
    E["solve_closure"] = Entry(
        gp.solve_closure,
        lambda: {"field": gp.AttentionField(gp.Sigmoid(*_weights(2))), "mean0": np.zeros(2),
                 "cov0": _cov(), "t_span": (0.0, 0.3), "n_per_dim": 4},
        {"field": "field", "mean0": "vector", "cov0": "cov", "n_per_dim": "quadrature",
         **SOLVER_KINDS, "method": "method"})
    E["GaussianMixture()"] = Entry(
        gp.GaussianMixture,
        lambda: {"weights": np.array([0.5, 0.5]), "means": np.array([[-1.0, 0.0], [1.0, 0.0]]),
                 "covs": np.stack([0.3 * np.eye(2)] * 2)},
        {"weights": "probabilities", "means": "matrix", "covs": "covs"})
    E["solve_mixture"] = Entry(
        gp.solve_mixture,
        lambda: {"attention": _softmax(), "mixture": _mixture(), "t_span": (0.0, 0.3),
                 "n_per_dim": 4},
        {"attention": "gattention", "mixture": "mixture", "n_per_dim": "quadrature",
         **SOLVER_KINDS, "merge_tol": "opt_pos", "method": "method"})
    E["mixture_velocity"] = Entry(
        gp.mixture_velocity,
        lambda: {"attention": _softmax(), "mixture": _mixture(), "x": _particles(4)},
        {"attention": "gattention", "mixture": "mixture", "x": "matrix"})
    E["Stack()"] = Entry(gp.Stack, lambda: {"layers": _softmax(), "n_layers": 3, "h": 0.1,
                                            "mode": "residual"},
                         {"layers": "layers", "n_layers": "count", "h": "pos", "mode": "mode"})
    E["propagate_gaussian"] = Entry(
        gp.propagate_gaussian,
        lambda: {"stack": _stack(), "mean0": np.zeros(2), "cov0": _cov(), "n_per_dim": 4},
        {"stack": "stack", "mean0": "vector", "cov0": "cov", "n_per_dim": "quadrature",
         "blowup_threshold": "threshold", "rtol": "tol", "atol": "pos"})
    E["propagate_gaussian(masked)"] = Entry(
        gp.propagate_gaussian,
        lambda: {"stack": gp.Stack(gp.Masked(*_weights(2)), n_layers=2, h=0.1,
                                   mode="continuous"),
                 "mean0": np.array([[0.0, 0.0], [0.5, 0.1]]), "cov0": _cov(), "n_per_dim": 4},
        {"stack": "stack", "mean0": "matrix", "cov0": "covs", "n_per_dim": "quadrature",
         "blowup_threshold": "threshold", "rtol": "tol", "atol": "pos"})
    E["solve_masked_closure"] = Entry(
        gp.solve_masked_closure,
        lambda: {"attention": gp.Masked(*_weights(2)),
                 "means0": np.array([[0.0, 0.0], [0.5, 0.1]]), "covs0": _cov(),
                 "t_span": (0.0, 0.3), "n_per_dim": 4},
        {"attention": "masked_attention", "means0": "matrix", "covs0": "covs",
         "n_per_dim": "quadrature", **SOLVER_KINDS, "method": "method"})
    E["propagate_particles"] = Entry(
        gp.propagate_particles,
        lambda: {"stack": _stack(), "x0": _particles(), "steps_per_layer": 2},
        {"stack": "stack", "x0": "particles", "steps_per_layer": "count",
         "blowup_threshold": "threshold", "n_directions": "count"})
    E["blowup_time"] = Entry(
        gp.blowup_time, lambda: {"attention": gp.Softmax(np.eye(2), np.eye(2), np.eye(2)),
                                 "cov0": _cov()},
        {"attention": "gattention", "cov0": "cov"})
    E["exact_covariance"] = Entry(
        gp.exact_covariance, lambda: {"attention": gp.Softmax(np.eye(2), np.eye(2), np.eye(2)),
                                      "cov0": _cov(), "t": np.array([0.0, 0.1])},
        {"attention": "gattention", "cov0": "cov", "t": "times"})
    E["scalar_solution"] = Entry(
        gp.scalar_solution,
        lambda: {"attention": gp.L2([[0.5]], [[0.4]], [[1.0]]), "mean0": 1.0, "var0": 0.5,
                 "t": np.array([0.0, 0.1])},
        {"attention": "scalar_attention", "mean0": "real", "var0": "pos", "t": "times"})
    E["bures_wasserstein"] = Entry(
        gp.bures_wasserstein,
        lambda: {"mean1": np.zeros(2), "cov1": _cov(), "mean2": np.ones(2), "cov2": np.eye(2)},
        {"mean1": "vector", "cov1": "cov", "mean2": "vector", "cov2": "cov", "squared": "flag"})
    for fname in ("normalized_covariance", "normalized_eigenvalues", "effective_rank",
                  "condition_number"):
        E[f"analysis.{fname}"] = Entry(getattr(analysis, fname), lambda: {"cov": _cov()},
                                       {"cov": "cov"})
    E["analysis.limit_rank"] = Entry(analysis.limit_rank, lambda: {"cov": _cov()},
                                     {"cov": "cov", "rtol": "tol", "atol": "nonneg"})
    E["classify_trajectory"] = Entry(
        gp.classify_trajectory,
        lambda: {"t": np.linspace(0, 1, 5), "cov": np.stack([_cov() / (1 + s) for s in range(5)])},
        {"t": "times", "cov": "covs", "rtol": "tol", "settle_tol": "tol", "status": "status"})
    E["classify_solution"] = Entry(
        gp.classify_solution,
        lambda: {"solution": gp.solve(_softmax(), None, _cov(), (0.0, 0.2))},
        {"solution": "solution", "attention": "opt_gattention"})
    E["SweepSpec.from_dict"] = Entry(
        _sweep_entry(), dict,
        {"sweep__attention": "spec_names", "sweep__dims": "spec_counts",
         "sweep__draws": "spec_int", "sweep__seed": "spec_int", "sweep__batch_size": "spec_int",
         "weights__k": "spec_rank", "weights__std": "spec_float", "weights__key": "spec_word",
         "weights__heads": "spec_int", "weights__head_type": "spec_word",
         "initial__rank": "spec_rank", "initial__std": "spec_float", "initial__cov": "spec_word",
         "solver__horizon": "spec_float", "solver__rtol": "spec_float",
         "solver__atol": "spec_float", "solver__blowup_threshold": "spec_float",
         "solver__max_nfev": "spec_int", "record__grid": "spec_int",
         "record__rank_threshold": "spec_float", "record__final_state": "spec_flag"})
    return E


# --------------------------------------------------------------------------------------
# bad values, by kind
# --------------------------------------------------------------------------------------

def _set(x, index, value):
    y = np.array(x, dtype=complex if isinstance(value, complex) else float)
    y[index] = value
    return y


ERROR, EITHER = "error", "either"

_ARRAY_BAD = {
    # name: (make(baseline value) -> bad value, expectation)
    "nan": (lambda x: _set(x, (0,) * np.ndim(x), np.nan), ERROR),
    "inf": (lambda x: _set(x, (0,) * np.ndim(x), np.inf), ERROR),
    "-inf": (lambda x: _set(x, (-1,) * np.ndim(x), -np.inf), ERROR),
    "complex": (lambda x: np.asarray(x) + 1j, ERROR),
    "complex0j": (lambda x: np.asarray(x) + 0j, EITHER),
    "str": (lambda x: "abc", ERROR),
    "None": (lambda x: None, ERROR),
    "list_of_str": (lambda x: [["a"] * np.shape(x)[-1]] * max(1, np.shape(x)[0]), ERROR),
    "ragged": (lambda x: [[1.0], [1.0, 2.0]], ERROR),
    "empty": (lambda x: np.empty((0,) * np.ndim(x)), ERROR),
    "scalar": (lambda x: 1.0, ERROR),
    "extra_axis": (lambda x: np.asarray(x)[None, None], ERROR),
    "wrong_size": (lambda x: np.pad(np.asarray(x, float), [(0, 1)] * np.ndim(x)), ERROR),
    "object": (lambda x: np.array([object()] * np.size(x)).reshape(np.shape(x)), ERROR),
    "overflow": (lambda x: np.asarray(x, float) * 1e300, EITHER),
    "underflow": (lambda x: np.asarray(x, float) * 1e-300, EITHER),
}


def _pick(*names, **extra):
    out = {n: _ARRAY_BAD[n] for n in names}
    out.update(extra)
    return out


_ALL_ARRAY = tuple(_ARRAY_BAD)


def _indefinite(c):
    c = np.array(c, float)
    return c - 2 * np.max(np.linalg.eigvalsh(c)) * np.eye(c.shape[-1])


def _rank1(c):
    c = np.array(c, float)
    v = np.ones(c.shape[-1])
    return np.broadcast_to(np.outer(v, v), c.shape).copy()


def _asym(c):
    c = np.array(c, float)
    c[..., 0, -1] += 0.5
    return c


def _heads_of(att):
    return att.heads if isinstance(att, gp.MultiHead) else None


def _scaled(att, s):
    """A copy of the single-head ``att`` with Q and K scaled by ``s`` (A by ``s**2``)."""
    return type(att)(att.Q * s, att.K * s, att.V, scale=att.scale)


_COV_BAD = _pick(*_ALL_ARRAY,
                 indefinite=(_indefinite, ERROR), asymmetric=(_asym, ERROR),
                 rank1=(_rank1, EITHER), zero=(lambda c: np.zeros_like(np.asarray(c, float)), EITHER),
                 non_square=(lambda c: np.asarray(c, float)[..., :1, :], ERROR))

_SCALAR = {
    "neg": (lambda v: -1.0, ERROR), "zero": (lambda v: 0.0, ERROR),
    "nan": (lambda v: float("nan"), ERROR), "inf": (lambda v: float("inf"), ERROR),
    "str": (lambda v: "1e-6", ERROR), "None": (lambda v: None, ERROR),
    "bool": (lambda v: True, ERROR), "complex": (lambda v: 1e-6 + 1j, ERROR),
    "list": (lambda v: [1e-3], ERROR), "tiny": (lambda v: 1e-300, EITHER),
    "huge": (lambda v: 1e300, EITHER), "np_float": (lambda v: np.float32(0.5), EITHER),
    "array0d": (lambda v: np.array(0.5), EITHER),
}


def _scal(*names, **extra):
    out = {n: _SCALAR[n] for n in names}
    out.update(extra)
    return out


_INT = {
    "zero": (lambda v: 0, ERROR), "neg": (lambda v: -3, ERROR), "float": (lambda v: 2.5, ERROR),
    "str": (lambda v: "3", ERROR), "None": (lambda v: None, ERROR), "bool": (lambda v: True, ERROR),
    "nan": (lambda v: float("nan"), ERROR), "np_int": (lambda v: np.int64(3), EITHER),
    "huge": (lambda v: 10 ** 15, EITHER),
}

_ATTN_GENERIC = {
    "str": (lambda a: "softmax", ERROR), "None": (lambda a: None, ERROR),
    "array": (lambda a: np.eye(2), ERROR),
    "wrong_d": (lambda a: gp.Softmax(*_weights(3)), ERROR),
}

_TSPAN = {
    "reversed": (lambda v: (v[1], v[0]), ERROR), "equal": (lambda v: (v[0], v[0]), ERROR),
    "nan": (lambda v: (0.0, float("nan")), ERROR), "inf": (lambda v: (0.0, float("inf")), ERROR),
    "three": (lambda v: (0.0, 0.1, 0.2), ERROR), "scalar": (lambda v: 1.0, ERROR),
    "str": (lambda v: "0,1", ERROR), "None": (lambda v: None, ERROR),
    "complex": (lambda v: (0.0, 1.0 + 1j), ERROR), "strs": (lambda v: ("0", "1"), ERROR),
    "array": (lambda v: np.array(v), EITHER), "negative_start": (lambda v: (-0.1, v[1]), EITHER),
    "tiny": (lambda v: (0.0, 1e-300), EITHER), "ints": (lambda v: (0, 1), EITHER),
}

_TEVAL = {
    "outside": (lambda v: [0.0, 1e3], ERROR), "decreasing": (lambda v: [0.1, 0.0], ERROR),
    "repeated": (lambda v: [0.0, 0.0], ERROR), "empty": (lambda v: [], ERROR),
    "nan": (lambda v: [0.0, float("nan")], ERROR), "2d": (lambda v: [[0.0, 0.1]], ERROR),
    "str": (lambda v: "0.1", ERROR), "complex": (lambda v: [0.0, 0.1j], ERROR),
    "one": (lambda v: [0.1], EITHER), "list_of_str": (lambda v: ["0", "0.1"], ERROR),
}

_METHOD = {
    "unknown": (lambda v: "Euler", ERROR), "int": (lambda v: 3, ERROR), "None": (lambda v: None, ERROR),
    "empty": (lambda v: "", ERROR), "lower": (lambda v: "rk45x", ERROR),
    "class_not_solver": (lambda v: dict, ERROR),
}

BAD = {
    "matrix": _pick(*_ALL_ARRAY),
    "weight": _pick(*_ALL_ARRAY, k_lt_d=(lambda x: np.asarray(x)[:1], EITHER),
                    d1=(lambda x: np.asarray(x)[:, :1], ERROR)),     # K and V keep d = 2
    "value": _pick(*_ALL_ARRAY, singular=(lambda x: np.zeros((2, 2)), EITHER)),
    "vector": _pick(*_ALL_ARRAY),
    "opt_vector": {k: v for k, v in _ARRAY_BAD.items() if k != "None"},
    "scale": _scal(*(k for k in _SCALAR if k != "None")),
    "particles": _pick(*_ALL_ARRAY, one_token=(lambda x: np.asarray(x)[:1], ERROR),
                       wrong_d=(lambda x: np.asarray(x)[:, :1], ERROR)),
    "cov": _COV_BAD,
    "covs": {**_COV_BAD, "2d": (lambda c: np.asarray(c)[0], ERROR)},
    "pos": _scal(*_SCALAR),
    "real": _scal("nan", "inf", "str", "None", "complex", "list", "huge", "tiny"),
    "nonneg": _scal("neg", "nan", "inf", "str", "complex", "bool"),
    "tol": _scal(*_SCALAR, one=(lambda v: 1.0, ERROR), two=(lambda v: 2.0, ERROR)),
    "opt_pos": _scal("neg", "zero", "nan", "inf", "str", "bool", "complex"),
    "opt_tol": _scal("neg", "zero", "nan", "inf", "str", "bool", one=(lambda v: 1.0, ERROR)),
    "threshold": _scal("neg", "zero", "nan", "inf", "str", "None", "bool",
                       one=(lambda v: 1.0, ERROR), half=(lambda v: 0.5, ERROR),
                       huge=(lambda v: 1e300, EITHER)),
    "max_step": _scal("neg", "zero", "nan", "str", "None", "bool", "complex", "tiny"),
    "count": dict(_INT),
    "count2": {**_INT, "one": (lambda v: 1, ERROR)},
    "opt_count": {k: v for k, v in _INT.items() if k != "None"},
    "quadrature": {**{k: v for k, v in _INT.items() if k != "huge"},
                   "one": (lambda v: 1, ERROR), "huge": (lambda v: 10 ** 6, ERROR)},
    "counts": {"empty": (lambda v: (), ERROR), "zero": (lambda v: (0, 10), ERROR),
               "one": (lambda v: (1, 10), ERROR), "float": (lambda v: (10.5, 20), ERROR),
               "str": (lambda v: "10", ERROR), "None": (lambda v: None, ERROR),
               "neg": (lambda v: (-10,), ERROR), "int": (lambda v: 10, EITHER)},
    "seeds": {"empty": (lambda v: (), ERROR), "str": (lambda v: "0", ERROR),
              "None": (lambda v: None, ERROR), "float": (lambda v: (0.5,), ERROR),
              "neg": (lambda v: (-1,), ERROR), "int": (lambda v: 2, EITHER)},
    "times": {"nan": (lambda v: [0.0, np.nan], ERROR), "inf": (lambda v: [0.0, np.inf], ERROR),
              "neg": (lambda v: [-1.0, 0.0], ERROR), "str": (lambda v: "0.1", ERROR),
              "None": (lambda v: None, ERROR), "complex": (lambda v: [0.0, 0.1j], ERROR),
              "2d": (lambda v: [[0.0, 0.1]], ERROR), "empty": (lambda v: [], ERROR),
              "list_of_str": (lambda v: ["0", "a"], ERROR)},
    "seed": {"str": (lambda v: "abc", ERROR), "neg": (lambda v: -1, ERROR),
             "float": (lambda v: 1.5, ERROR), "nan": (lambda v: float("nan"), ERROR),
             "generator": (lambda v: np.random.default_rng(0), EITHER), "None": (lambda v: None, EITHER)},
    "t_span": _TSPAN,
    "t_eval": _TEVAL,
    "method": _METHOD,
    "batch_method": {**_METHOD, "RK45": (lambda v: "RK45", ERROR)},
    "events": {"int": (lambda v: 3, ERROR), "list_int": (lambda v: [3], ERROR),
               "str": (lambda v: "blowup", ERROR)},
    "flag": {"str": (lambda v: "yes", ERROR), "None": (lambda v: None, ERROR),
             "int2": (lambda v: 2, ERROR), "array": (lambda v: np.array([True, False]), ERROR)},
    "dtype": {"int": (lambda v: np.int32, ERROR), "str": (lambda v: "float16", ERROR),
              "None": (lambda v: None, ERROR), "complex": (lambda v: np.complex128, ERROR),
              "f32": (lambda v: np.float32, EITHER)},
    "mode": {"unknown": (lambda v: "resid", ERROR), "None": (lambda v: None, ERROR),
             "int": (lambda v: 1, ERROR), "list": (lambda v: ["residual"], ERROR)},
    "status": {"unknown": (lambda v: "exploded", ERROR), "int": (lambda v: 3, ERROR),
               "list": (lambda v: ["finished"], ERROR)},
    "probabilities": {**_pick("nan", "inf", "complex", "str", "None", "empty", "scalar",
                              "extra_axis", "list_of_str"),
                      "neg": (lambda w: np.array([1.5, -0.5]), ERROR),
                      "zero": (lambda w: np.array([1.0, 0.0]), ERROR),
                      "not_summing": (lambda w: np.array([0.5, 0.6]), ERROR),
                      "wrong_size": (lambda w: np.array([0.2, 0.3, 0.5]), ERROR)},
    # attention arguments (the configuration: types, d = 1, k < d, scales, singular A)
    "attention": {**_ATTN_GENERIC,
                  "masked_needs_positions": (lambda a: gp.Masked(*_weights(2)), EITHER),
                  "sigmoid": (lambda a: gp.Sigmoid(*_weights(2)), EITHER),
                  "sinkhorn": (lambda a: gp.Sinkhorn(*_weights(2)), EITHER),
                  "l2": (lambda a: gp.L2(*_weights(2)), EITHER),
                  "multihead": (lambda a: gp.MultiHead([a, gp.L2(*_weights(2))]), EITHER),
                  "k_lt_d": (lambda a: gp.Softmax(*_weights(2, k=1)), EITHER),
                  "singular_A": (lambda a: gp.Softmax(np.zeros((2, 2)), *_weights(2)[1:]), EITHER),
                  "big_weights": (lambda a: _scaled(a, 1e3), EITHER),
                  "tiny_weights": (lambda a: _scaled(a, 1e-150), EITHER)},
    # the masked closure's head (a Masked attention; its own weights' configurations)
    "masked_attention": {**_ATTN_GENERIC,
                         "softmax": (lambda a: gp.Softmax(*_weights(2)), ERROR),
                         "wrong_d_masked": (lambda a: gp.Masked(*_weights(3)), ERROR),
                         "k_lt_d": (lambda a: gp.Masked(*_weights(2, k=1)), EITHER),
                         "singular_A": (lambda a: gp.Masked(np.zeros((2, 2)),
                                                            *_weights(2)[1:]), EITHER),
                         "big_weights": (lambda a: _scaled(a, 1e3), EITHER),
                         "tiny_weights": (lambda a: _scaled(a, 1e-150), EITHER)},
    "gattention": {**_ATTN_GENERIC,
                   "sigmoid": (lambda a: gp.Sigmoid(*_weights(2)), ERROR),
                   "masked": (lambda a: gp.Masked(*_weights(2)), ERROR),
                   "class": (lambda a: gp.Softmax, ERROR),
                   "l2": (lambda a: gp.L2(*_weights(2)), EITHER),
                   "sinkhorn": (lambda a: gp.Sinkhorn(*_weights(2)), EITHER),
                   "multihead": (lambda a: gp.MultiHead([gp.L2(*_weights(2)), gp.Sinkhorn(*_weights(2))]),
                                 EITHER),
                   "k_lt_d": (lambda a: gp.L2(*_weights(2, k=1)), EITHER),
                   "singular_A": (lambda a: gp.L2(np.zeros((2, 2)), *_weights(2)[1:]), EITHER),
                   "scale_1e6": (lambda a: _scaled(gp.Softmax(*_weights(2)), 1e3), EITHER),
                   "scale_1e-6": (lambda a: _scaled(gp.Softmax(*_weights(2)), 1e-3), EITHER)},
    "opt_gattention": {"str": (lambda a: "softmax", ERROR), "array": (lambda a: np.eye(2), ERROR),
                       "sigmoid": (lambda a: gp.Sigmoid(*_weights(2)), ERROR),
                       "wrong_d": (lambda a: gp.Softmax(*_weights(3)), ERROR)},
    "closure_attention": {**_ATTN_GENERIC,
                          "masked": (lambda a: gp.Masked(*_weights(2)), ERROR),
                          "softmax": (lambda a: _softmax(), EITHER),
                          "class": (lambda a: gp.Sigmoid, ERROR)},
    "scalar_attention": {"str": (lambda a: "l2", ERROR), "None": (lambda a: None, ERROR),
                         "d2": (lambda a: _softmax(), ERROR),
                         "sigmoid": (lambda a: gp.Sigmoid([[1.0]], [[1.0]], [[1.0]]), ERROR),
                         "softmax": (lambda a: gp.Softmax([[0.5]], [[0.4]], [[1.0]]), EITHER),
                         "sinkhorn": (lambda a: gp.Sinkhorn([[0.5]], [[0.4]], [[1.0]]), EITHER),
                         "zero_V": (lambda a: gp.L2([[0.5]], [[0.4]], [[0.0]]), EITHER),
                         "zero_A": (lambda a: gp.L2([[0.0]], [[0.4]], [[1.0]]), EITHER),
                         "k_gt_d": (lambda a: gp.L2([[0.5], [0.1]], [[0.4], [0.2]], [[1.0]]), EITHER)},
    "batch_attention": {**_ATTN_GENERIC,
                        "sigmoid": (lambda a: gp.Sigmoid(*_weights(2)), ERROR),
                        "empty_list": (lambda a: [], ERROR),
                        "one_of_two": (lambda a: [a], ERROR),
                        "three_of_two": (lambda a: [a, a, a], ERROR),
                        "mixed": (lambda a: [a, gp.MultiHead([gp.L2(*_weights(2)), a])], EITHER),
                        "mixed_d": (lambda a: [a, gp.Softmax(*_weights(3))], ERROR),
                        "list_of_str": (lambda a: ["softmax", "l2"], ERROR)},
    "weights_dict": {"unknown_kind": (lambda w: {**w, "kind": "relu"}, ERROR),
                     "no_kind": (lambda w: {k: v for k, v in w.items() if k != "kind"}, ERROR),
                     "no_Q": (lambda w: {k: v for k, v in w.items() if k != "Q"}, ERROR),
                     "extra_key": (lambda w: {**w, "bias": 1.0}, ERROR),
                     "nan_Q": (lambda w: {**w, "Q": _set(w["Q"], (0, 0), np.nan)}, ERROR),
                     "str_V": (lambda w: {**w, "V": "abc"}, ERROR),
                     "bad_B": (lambda w: {**w, "Q": np.stack([w["Q"]] * 3)}, ERROR),
                     "scale_neg": (lambda w: {**w, "scale": -1.0}, ERROR),
                     "scale_nan": (lambda w: {**w, "scale": [np.nan, 1.0]}, ERROR),
                     "kind_multihead": (lambda w: {**w, "kind": "multihead"}, ERROR),
                     "kind_sigmoid": (lambda w: {**w, "kind": "sigmoid"}, ERROR),
                     "complex_K": (lambda w: {**w, "K": w["K"] + 1j}, ERROR),
                     "k_lt_d": (lambda w: {**w, "Q": w["Q"][:1], "K": w["K"][:1]}, EITHER),
                     "huge_Q": (lambda w: {**w, "Q": w["Q"] * 1e150}, EITHER),
                     "zero_k": (lambda w: {**w, "Q": w["Q"][:0], "K": w["K"][:0]}, ERROR)},
    "heads": {"empty": (lambda h: [], ERROR), "one_head": (lambda h: h[0], ERROR),
              "str": (lambda h: "softmax", ERROR), "None": (lambda h: None, ERROR),
              "mixed_d": (lambda h: [h[0], gp.Softmax(*_weights(3))], ERROR),
              "sigmoid": (lambda h: [h[0], gp.Sigmoid(*_weights(2))], ERROR),
              "list_of_str": (lambda h: ["softmax", "l2"], ERROR),
              "nested": (lambda h: [gp.MultiHead(h), h[0]], EITHER)},
    "field": {"str": (lambda f: "sigmoid", ERROR), "None": (lambda f: None, ERROR),
              "attention": (lambda f: gp.Sigmoid(*_weights(2)), EITHER),
              "wrong_d": (lambda f: gp.AttentionField(gp.Sigmoid(*_weights(3))), ERROR),
              "masked": (lambda f: gp.Masked(*_weights(2)), ERROR)},
    "mixture": {"str": (lambda m: "mixture", ERROR), "None": (lambda m: None, ERROR),
                "tuple": (lambda m: (m.weights, m.means, m.covs), ERROR),
                "wrong_d": (lambda m: gp.GaussianMixture([1.0], [[0.0, 0.0, 0.0]], [np.eye(3)]), ERROR),
                "one_component": (lambda m: gp.GaussianMixture([1.0], [[0.0, 0.0]], [np.eye(2)]), EITHER),
                "rank1": (lambda m: gp.GaussianMixture([0.5, 0.5], m.means, [np.ones((2, 2))] * 2), EITHER)},
    "layers": {"empty": (lambda f: [], ERROR), "str": (lambda f: "softmax", ERROR),
               "None": (lambda f: None, ERROR), "mixed_d": (lambda f: [f, gp.Softmax(*_weights(3))], ERROR),
               "array": (lambda f: np.eye(2), ERROR)},
    "stack": {"str": (lambda s: "stack", ERROR), "None": (lambda s: None, ERROR),
              "attention": (lambda s: _softmax(), ERROR),
              "wrong_d": (lambda s: gp.Stack(gp.Softmax(*_weights(3)), n_layers=2), ERROR)},
    "solution": {"str": (lambda s: "sol", ERROR), "None": (lambda s: None, ERROR),
                 "dict": (lambda s: {"t": [0.0], "cov": [np.eye(2)]}, ERROR),
                 # final states only (no t_eval), none decided by a blow-up
                 "batch_final_only": (lambda s: gp.solve_batch(
                     _softmax(), np.stack([_cov(), np.eye(2)]), (0.0, 0.2)), ERROR)},
    "dict_kind": {},
    # sweep specification keys (the TOML values)
    "spec_int": {"neg": (lambda v: -1, ERROR), "float": (lambda v: 2.5, ERROR),
                 "str": (lambda v: "2", ERROR), "bool": (lambda v: True, ERROR),
                 "list": (lambda v: [2], ERROR), "table": (lambda v: {"a": 1}, ERROR)},
    "spec_float": {"neg": (lambda v: -1.0, ERROR), "nan": (lambda v: float("nan"), ERROR),
                   "inf": (lambda v: float("inf"), ERROR), "str": (lambda v: "1.0", ERROR),
                   "bool": (lambda v: True, ERROR), "list": (lambda v: [1.0], ERROR)},
    "spec_word": {"unknown": (lambda v: "nope", ERROR), "int": (lambda v: 1, ERROR),
                  "list": (lambda v: ["softmax"], ERROR), "bool": (lambda v: False, ERROR)},
    "spec_rank": {"unknown": (lambda v: "most", ERROR), "zero": (lambda v: 0, ERROR),
                  "float": (lambda v: 1.5, ERROR), "bool": (lambda v: True, ERROR),
                  "huge": (lambda v: 10 ** 6, EITHER)},
    "spec_names": {"empty": (lambda v: [], ERROR), "unknown": (lambda v: ["relu"], ERROR),
                   "sigmoid": (lambda v: ["sigmoid"], ERROR), "repeat": (lambda v: ["l2", "l2"], ERROR),
                   "int": (lambda v: [1], ERROR), "table": (lambda v: {"a": 1}, ERROR),
                   "str": (lambda v: "l2", EITHER)},
    "spec_counts": {"empty": (lambda v: [], ERROR), "zero": (lambda v: [0], ERROR),
                    "float": (lambda v: [2.5], ERROR), "str": (lambda v: ["2"], ERROR),
                    "repeat": (lambda v: [2, 2], ERROR), "bool": (lambda v: [True], ERROR),
                    "int": (lambda v: 3, EITHER)},
    "spec_flag": {"int": (lambda v: 1, ERROR), "str": (lambda v: "true", ERROR)},
}

#: bad values per argument in the default run: a rotating sample, so that every bad
#: value of a kind is tried somewhere (``cases(full=True)`` tries every one everywhere)
DEFAULT_PER_ARGUMENT = 4

# where a result may hold NaN: the fields documented "NaN once a trajectory stopped" or
# "NaN where there is none" (every other float must be finite)
NAN_FIELDS = {
    "BatchSolution": {"cov", "t_blowup"},
    "CompareReport": {"ode_mean", "ode_cov", "mean", "cov", "mean_error", "cov_error", "bw",
                      "bw_relative", "sliced_w2", "kurtosis", "ess_min", "ess_median",
                      "sinkhorn_error", "slopes", "slope_sem"},
    "TrajectoryOutcome": {"limit"},
    # documented: NaN where a growth or blow-up verdict leaves no limit to fit
    "CertifiedLimit": {"exponents", "pivot_exponents", "conserved_drift", "eigenvalues",
                       "closed_form_gap"},
}
#: where a result may be +inf: documented (blowup_time: no blow-up; condition_number: singular)
INF_OK = {"blowup_time", "analysis.condition_number"}


#: argument -> other arguments an error may name instead: the bad value breaks a relation
#: between the two (a Q of a new shape no longer matches K; an attention of another
#: dimension no longer matches the covariance), and the message names the other side
RELATED = {
    "Q": ("K",),
    "attention": ("mean", "mean0", "cov", "cov0", "x0", "x", "mixture", "t"),
    "field": ("mean", "mean0", "cov", "cov0"),
    "stack": ("mean0", "cov0", "x0"),
    "cov": ("mean",),
    "cov0": ("t",),
    "attentions_or_weights": ("cov0s", "Q", "K", "V", "scale"),
    "weights": ("means",),
    "layers": ("n_layers",),
    "t": ("cov",),
}

#: (entry, argument, bad value) -> the expectation, where the generic one does not apply;
#: each with the documented behaviour that makes it a valid input
OVERRIDES = {
    # a single AttentionField of another dimension is a valid field on its own
    ("AttentionField()", "attention", "wrong_d"): EITHER,
    # compare: t_eval None is the documented default, t_eval[0] (any sign) the start
    ("compare", "t_eval", "None"): EITHER,
    ("compare", "t_eval", "neg"): EITHER,
    # an empty array of times gives an empty array of covariances
    ("exact_covariance", "t", "empty"): EITHER,
    ("scalar_solution", "t", "empty"): EITHER,
    # the scalar solutions are explicit formulas, valid backwards in time too
    ("scalar_solution", "t", "neg"): EITHER,
    ("scalar_solution", "mean0", "list"): EITHER,
    # bures_wasserstein broadcasts leading axes of the means (documented)
    ("bures_wasserstein", "mean1", "extra_axis"): EITHER,
    ("bures_wasserstein", "mean2", "extra_axis"): EITHER,
    ("bures_wasserstein", "cov1", "extra_axis"): EITHER,
    ("bures_wasserstein", "cov2", "extra_axis"): EITHER,
    # limit_rank and classify_trajectory take rtol in [0, 1) (documented)
    ("analysis.limit_rank", "rtol", "zero"): EITHER,
    ("classify_trajectory", "rtol", "zero"): EITHER,
    # dtype=None is NumPy's default dtype, float64
    ("simulate_particles", "dtype", "None"): EITHER,
}
for _f in ("normalized_covariance", "normalized_eigenvalues", "effective_rank",
           "condition_number", "limit_rank"):
    # a zero-padded 3 x 3 covariance is a valid covariance where no d is imposed, and
    # these functions take stacks (..., d, d)
    OVERRIDES[(f"analysis.{_f}", "cov", "wrong_size")] = EITHER
    OVERRIDES[(f"analysis.{_f}", "cov", "extra_axis")] = EITHER

#: bad values that are valid but expensive (a run that burns its whole evaluation budget
#: before reporting "failed"): in the slow corpus only, with its longer time limit
SLOW_ONLY = {("pos", "tiny"), ("attention", "big_weights"), ("gattention", "scale_1e6"),
             ("masked_attention", "big_weights")}

#: known failures, expected to fail (``xfail(strict=False)``) with a short time limit;
#: case id -> what happens now
KNOWN = {}


@dataclasses.dataclass(frozen=True)
class Case:
    """One corpus case."""

    entry: str
    arg: str
    bad: str
    expect: str

    @property
    def id(self):
        return f"{self.entry}/{self.arg}/{self.bad}"


def cases(full=False):
    """Every corpus case (``full``: every bad value of every kind)."""
    out = []
    turn = {}
    for name, entry in entries().items():
        for arg, kind in entry.kinds.items():
            table = BAD[kind]
            subset = [b for b in table if full or (kind, b) not in SLOW_ONLY]
            if not full and len(subset) > DEFAULT_PER_ARGUMENT:
                start = turn.get(kind, 0)
                turn[kind] = start + DEFAULT_PER_ARGUMENT
                subset = [subset[(start + j) % len(subset)] for j in range(DEFAULT_PER_ARGUMENT)]
            for bad in subset:
                expect = OVERRIDES.get((name, arg, bad), table[bad][1])
                out.append(Case(name, arg, bad, expect))
    return out


def build_call(case):
    """``(func, kwargs)`` of ``case``: the baseline with the argument replaced."""
    entry = entries()[case.entry]
    kwargs = entry.baseline()
    make, _ = BAD[entry.kinds[case.arg]][case.bad]
    if case.entry == "SweepSpec.from_dict":
        kwargs[case.arg] = make(_spec_dict()[case.arg.split("__")[0]][case.arg.split("__")[1]])
    else:
        kwargs[case.arg] = make(kwargs.get(case.arg, _default(entry.func, case.arg)))
    return entry.func, kwargs


def _default(func, arg):
    import inspect

    try:
        p = inspect.signature(func).parameters[arg]
    except (KeyError, TypeError, ValueError):
        return None
    return None if p.default is inspect.Parameter.empty else p.default


# --------------------------------------------------------------------------------------
# checking a result
# --------------------------------------------------------------------------------------

_STATUSES = {s.value for s in gp.Status}


def check_result(obj, entry, path="result", owner=None, depth=0):
    """Problems with a returned value: non-finite numbers outside the documented places."""
    problems = []
    if depth > 6:
        return problems
    nan_ok = path.rsplit(".", 1)[-1] in NAN_FIELDS.get(owner, ())
    if isinstance(obj, enum.Enum):
        return problems
    if isinstance(obj, (bool, str, type(None))):
        return problems
    if isinstance(obj, (float, int, complex, np.number)):
        obj = np.asarray(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc":
            if np.isinf(obj).any() and entry not in INF_OK:
                problems.append(f"{path}: inf")
            if np.isnan(obj).any() and not nan_ok:
                problems.append(f"{path}: NaN")
        elif obj.dtype.kind in "OU" and path.endswith("status"):
            bad = set(map(str, obj.ravel())) - _STATUSES
            if bad:
                problems.append(f"{path}: unknown status {bad}")
        return problems
    if dataclasses.is_dataclass(obj):
        name = type(obj).__name__
        if hasattr(obj, "status") and isinstance(obj.status, str) and obj.status not in _STATUSES:
            problems.append(f"{path}.status = {obj.status!r} is not a Status")
        for f in dataclasses.fields(obj):
            problems += check_result(getattr(obj, f.name), entry, f"{path}.{f.name}", name, depth + 1)
        return problems
    if isinstance(obj, dict):
        for k, v in obj.items():
            problems += check_result(v, entry, f"{path}.{k}" if owner else f"{path}[{k!r}]",
                                     owner, depth + 1)
        return problems
    if isinstance(obj, (tuple, list)):
        for v in obj:
            problems += check_result(v, entry, path, owner, depth + 1)
        return problems
    if isinstance(obj, gp.SingleHeadAttention):
        return check_result(obj.A, entry, f"{path}.A", None, depth + 1)
    if isinstance(obj, gp.MultiHead):
        return check_result(list(obj.heads), entry, path, None, depth + 1)
    return problems


def names_argument(message, arg):
    """Whether an error message names ``arg`` (or a related argument, or a sweep key)."""
    arg = arg.replace("__", ".")
    for name in (arg, *RELATED.get(arg, ())):
        last = name.split(".")[-1]
        if f"`{name}" in message or f"`{last}`" in message or f"`{last}[" in message:
            return True
    return False


# --------------------------------------------------------------------------------------
# running one case in a worker process with a time limit
# --------------------------------------------------------------------------------------

def _classify(case):
    """What ``case`` does (in the worker): ``(verdict, detail)``; verdict "error"/"result"/"bad"."""
    func, kwargs = build_call(case)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = func(**kwargs)
    except (ValueError, TypeError) as exc:
        msg = f"{type(exc).__name__}: {exc}"
        if not names_argument(str(exc), case.arg):
            return "bad", f"message does not name `{case.arg}`: {msg}"
        return "error", msg
    except Exception as exc:   # noqa: BLE001 - any other exception is the finding
        return "bad", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
    problems = check_result(out, case.entry)
    if problems:
        return "bad", "non-finite result: " + "; ".join(problems[:5])
    return "result", type(out).__name__


def _serve(conn):
    """The worker's loop: run the cases it is sent, one at a time, with a watchdog."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    while True:
        try:
            case, timeout = conn.recv()
        except EOFError:
            os._exit(0)
        # past the limit, dump every thread's traceback to stderr and exit: the parent
        # reads the silence as a hang
        faulthandler.dump_traceback_later(timeout, exit=True)
        try:
            res = _classify(case)
        except BaseException as exc:   # noqa: BLE001
            res = ("bad", f"worker crashed: {exc!r}")
        faulthandler.cancel_dump_traceback_later()
        conn.send(res)


class _Worker:
    """One forked process that runs cases; killed and replaced after a hang."""

    def __init__(self):
        self.proc = None

    def _start(self):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.conn.close()
            self.proc = None

    def run(self, case, timeout):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((case, timeout))
        if self.conn.poll(timeout + 2.0):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        self.stop()
        return "hang", (f"no answer within {timeout} s (the worker's faulthandler traceback "
                        "is on stderr)")


_WORKERS = threading.local()


def run_case(case, timeout=10.0):
    """``(verdict, detail)`` of ``case``, run in a worker process; ``"hang"`` past ``timeout``.

    One worker per calling thread, forked on first use and replaced after a hang.
    """
    worker = getattr(_WORKERS, "worker", None)
    if worker is None:
        worker = _WORKERS.worker = _Worker()
        atexit.register(worker.stop)
    return worker.run(case, timeout)


def verdict_ok(case, verdict):
    """Whether ``verdict`` meets the case's expectation."""
    if verdict == "error":
        return True
    if verdict == "result":
        return case.expect == EITHER
    return False


def main(argv):
    """``python -m tests._corpus [--full] [--jobs N]``: every failing case and the counts."""
    from concurrent.futures import ThreadPoolExecutor

    full = "--full" in argv
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 1
    timeout = 120.0 if full else 10.0
    todo = cases(full=full)
    counts = {}
    with ThreadPoolExecutor(jobs) as pool:
        runs = pool.map(lambda c: run_case(c, 5.0 if c.id in KNOWN else timeout), todo)
        for c, (v, detail) in zip(todo, runs):
            counts[v] = counts.get(v, 0) + 1
            counts[f"expect_{c.expect}"] = counts.get(f"expect_{c.expect}", 0) + 1
            if c.id in KNOWN:
                counts["known"] = counts.get("known", 0) + 1
            if not verdict_ok(c, v):
                print(f"FAIL {c.id} [{c.expect}] {v}: {detail[-600:]}", flush=True)
    print(counts, len(todo))


if __name__ == "__main__":
    main(sys.argv[1:])
