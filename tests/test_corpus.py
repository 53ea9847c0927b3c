"""The bad-input corpus (tests/_corpus.py): every public entry point, every argument.

Each case runs in a forked worker with a time limit: it must raise ``ValueError`` or
``TypeError`` naming the argument, or (where the input is valid, e.g. a 1e300 scale or a
rank-deficient covariance) return a finite result with a documented status. A hang fails
its case with a faulthandler traceback. The default run takes a rotating sample of the bad
values of every argument; ``-m slow`` runs every combination.
"""

import inspect

import pytest

import gaussian_pde as gp
from tests import _corpus as corpus

#: per-case time limits (seconds): generous for a machine shared by several jobs
TIMEOUT, TIMEOUT_SLOW = 20.0, 120.0

#: public callables the corpus does not call, and why
NOT_IN_CORPUS = {
    # result and record types: built by the solvers, not by users
    "BatchSolution", "CompareReport", "DepthSolution", "MixtureSolution", "MomentSolution",
    "ParticleDiagnostics", "ParticleSolution", "TrajectoryOutcome", "Outcome", "Status",
    "CertifiedLimit",
    "ParticleDegeneracyWarning", "SinkhornConvergenceWarning",
    # abstract bases
    "Attention", "SingleHeadAttention", "Field",
    # covered by their own validation tests (tests/closure, tests/attention)
    "Affine", "MLP", "LayerNorm", "RMSNorm", "TraceNorm", "PreNorm", "FieldSum",
    "block_positions", "logistic_normal_moments", "get_attention",
    "register_attention",
}


#: a known failure may hang: it gets this limit, so that it does not cost the suite much
TIMEOUT_KNOWN = 5.0


def _param(case, timeout):
    marks = []
    if case.id in corpus.KNOWN:
        timeout = TIMEOUT_KNOWN
        marks.append(pytest.mark.xfail(strict=False, reason="known: "
                                       + corpus.KNOWN[case.id]))
    return pytest.param(case, timeout, id=case.id, marks=marks)


DEFAULT = corpus.cases()
_default_ids = {c.id for c in DEFAULT}
FULL = [c for c in corpus.cases(full=True) if c.id not in _default_ids]


def _check(case, timeout):
    verdict, detail = corpus.run_case(case, timeout=timeout)
    want = "a clear error" if case.expect == "error" else "a clear error or a finite result"
    assert corpus.verdict_ok(case, verdict), f"{case.id}: expected {want}, got {verdict}: {detail}"


@pytest.mark.parametrize("case, timeout", [_param(c, TIMEOUT) for c in DEFAULT])
def test_bad_input(case, timeout):
    _check(case, timeout)


@pytest.mark.slow
@pytest.mark.parametrize("case, timeout", [_param(c, TIMEOUT_SLOW) for c in FULL])
def test_bad_input_full(case, timeout):
    _check(case, timeout)


def test_corpus_covers_the_public_api():
    """Every public callable is in the corpus (or listed, with the reason, above)."""
    called = {getattr(e.func, "__name__", None) for e in corpus.entries().values()}
    called |= {type(e.func).__name__ for e in corpus.entries().values()}
    missing = [name for name in gp.__all__
               if callable(getattr(gp, name)) and name not in NOT_IN_CORPUS
               and name not in called and getattr(gp, name).__name__ not in called]
    assert not missing, f"public callables without corpus cases: {missing}"


def test_corpus_covers_every_registered_type_and_argument():
    """Every registered attention constructor, and every argument of every entry point."""
    entries = corpus.entries()
    for name in gp.ATTENTIONS:
        assert f"{name}()" in entries
    for name, entry in entries.items():
        if name == "SweepSpec.from_dict" or "[" in name:   # variants of another entry
            continue
        params = set(inspect.signature(entry.func).parameters)
        assert set(entry.kinds) <= params, (name, set(entry.kinds) - params)
        # every argument without a default (the required ones) has bad values
        required = {p.name for p in inspect.signature(entry.func).parameters.values()
                    if p.default is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        assert required <= set(entry.kinds), (name, required - set(entry.kinds))
    for kind in {k for e in entries.values() for k in e.kinds.values()}:
        assert corpus.BAD[kind], kind


def test_a_hang_fails_its_case(monkeypatch):
    """The worker's time limit turns a hang into a verdict (not a blocked suite)."""
    import time

    def spin(t):
        while t > 0:     # a hang without end (pure Python, like a stuck step loop)
            pass

    entries = corpus.entries()
    entries["_spin"] = corpus.Entry(spin, lambda: {"t": 0.0}, {"t": "pos"})
    monkeypatch.setattr(corpus, "entries", lambda: entries)
    worker = corpus._Worker()     # forked after the patch: it sees the new entry
    try:
        t0 = time.perf_counter()
        assert worker.run(corpus.Case("_spin", "t", "zero", corpus.EITHER), 1.0)[0] == "result"
        verdict, detail = worker.run(corpus.Case("_spin", "t", "huge", corpus.EITHER), 1.0)
        assert verdict == "hang", detail
        # the next case gets a fresh worker
        assert worker.run(corpus.Case("_spin", "t", "zero", corpus.EITHER), 1.0)[0] == "result"
        assert time.perf_counter() - t0 < 15
    finally:
        worker.stop()
