r"""Multi-head attention: the moment equations of a sum of heads.

The multi-head velocity is the sum of the heads' fields,
:math:`\Gamma = \sum_h \Gamma_h`. Each Gaussian-preserving head gives an affine field
:math:`b_h + M_h x`, so the sum is affine with :math:`M = \sum_h M_h`,
:math:`b = \sum_h b_h`, and since the moment equations are linear in ``(M, b)`` they are
the sums of the heads' equations (checked by SymPy below). Heads may mix types
(softmax, L2, Sinkhorn): no new generated code is needed, ``gaussian_pde.MultiHead`` sums
the heads' generated right-hand sides.
"""

from __future__ import annotations

import sympy as sp

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "multihead"
TITLE = "Multi-head attention"


def check_linearity(heads=3):
    """SymPy check: moment equations of the summed field equal the summed equations."""
    Ms = [sp.MatrixSymbol(f"M{h}", S.d, S.d) for h in range(heads)]
    bs = [sp.MatrixSymbol(f"b{h}", S.d, 1) for h in range(heads)]
    total = S.moment_equations(sp.MatAdd(*Ms), sp.MatAdd(*bs))
    parts = [S.moment_equations(M, b) for M, b in zip(Ms, bs)]
    return all(
        sp.expand(total[i] - sp.MatAdd(*[p[i] for p in parts])).doit() in
        (0, sp.ZeroMatrix(*total[i].shape))
        for i in range(3))


def equations_latex():
    """LaTeX lines of the multi-head section of ``equations.md``."""
    return ["$$M = \\sum_h M_h,\\quad b = \\sum_h b_h$$ (moment equations add over heads)", ""]


CHECKS = {"moment equations are additive over heads": check_linearity}

if __name__ == "__main__":
    print(TITLE)
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
