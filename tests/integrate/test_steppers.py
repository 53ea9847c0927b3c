"""The engine's steppers (:mod:`gaussian_pde.integrate._steppers`): the stage sums, the stiffness test."""

import numpy as np

from gaussian_pde.integrate import _compiled_engine
from gaussian_pde.integrate import _steppers as st


def test_stage_sums_skip_only_zero_coefficients(rng):
    """The compiled sums of the stages over the nonzero coefficients only: the same bits
    as the sum over every column in order, and every column a nonfinite stage could hide
    in is kept."""
    _compiled_engine._core()      # (compiles the steppers' helpers too)
    ns = st._NS
    tables = [(st._A, st._A_COLS, range(1, 16), lambda r: r),
              (st._B2, st._B_COLS, [0], lambda r: ns),
              (st._E53, st._E_COLS, [0, 1], lambda r: ns + 1),
              (st._D, st._D_COLS, range(4), lambda r: 16)]
    skipped = 0
    for n in (9, 12, st._ROWS_FROM + 4):       # dot products, and along the rows
        K = rng.standard_normal((16, n)) * 10.0 ** rng.integers(-3, 4, size=(16, 1))
        for C, cols, rows, last in tables:
            for r in rows:
                out = np.empty(n)
                st._combine(C, cols, r, K, out)
                want = np.zeros(n)
                for j in range(last(r)):        # every column, in order
                    want = want + C[r, j] * K[j]
                assert out.tobytes() == want.tobytes()
                skipped += last(r) - cols[1][r]
    assert skipped > 0
    # the first nonfinite stage meets a nonzero coefficient in the next stage ...
    assert all(st._A[s, s - 1] != 0 for s in range(1, 16))
    # ... and the new state and the error see every stage, f(y_new) included
    assert st._B_COLS[1][0] == ns and st._E_COLS[1].tolist() == [9, 9]
    assert st._E_COLS[0][0, 8] == ns


def test_the_second_stiffness_test_counts_blocks_of_accepted_steps():
    """It fires at the end of a block of accepted steps with at least ``_CRAWL_STEPS`` of
    :math:`h|\\lambda| \\ge` ``_CRAWL_HLAMB``, never inside one; a rejected step does not
    count."""
    from gaussian_pde.integrate._steppers import (
        _CRAWL_BLOCK,
        _CRAWL_HLAMB,
        _CRAWL_STEPS,
        _crawl_counts,
    )

    fired = []
    block = crawl = 0
    for n_crawl in (_CRAWL_STEPS, _CRAWL_STEPS - 1, _CRAWL_BLOCK):
        for i in range(_CRAWL_BLOCK):
            hlamb = _CRAWL_HLAMB if i < n_crawl else 0.5 * _CRAWL_HLAMB
            block, crawl, f = _crawl_counts(True, hlamb, block, crawl)
            fired.append(f)
            block, crawl, f = _crawl_counts(False, hlamb, block, crawl)
            assert not f
    assert [k for k, f in enumerate(fired) if f] == [_CRAWL_BLOCK - 1, 3 * _CRAWL_BLOCK - 1]
