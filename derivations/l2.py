r"""L2 attention: derivation of the Gaussian moment equations.

Score :math:`s(x, y) = -c\,|Qx - Ky|^2`. Differentiating in ``y`` gives
:math:`H = 2c\,K^TK` (positive semi-definite, so the tilted Gaussian always exists),
:math:`A = 2c\,K^TQ` and :math:`g = 0`; the tilted mean is
:math:`(I + 2c\,\Sigma K^TK)^{-1}(\alpha + 2c\,\Sigma K^TQ x)` and

.. math::

    M = 2c\,V(I + 2c\,\Sigma K^TK)^{-1}\Sigma K^TQ,\qquad
    b = V(I + 2c\,\Sigma K^TK)^{-1}\alpha .

No inverse of :math:`\Sigma`, ``K`` or ``Q`` appears: the formula holds for singular
covariances and for ``k < d``. Run ``python derivations/l2.py`` to print the derivation.
"""

from __future__ import annotations

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "l2"
TITLE = "L2 attention"
SCORE = -S.scale * (S.Q * S.x - S.K * S.y).T * (S.Q * S.x - S.K * S.y)


def derive():
    """The affine field of L2 attention against a Gaussian."""
    return S.quadratic_score_field(SCORE)


def functions():
    """Generated-code functions (see :func:`derivations._symbolic.affine_functions`)."""
    return S.affine_functions(derive(), TITLE)


CHECKS = S.integration_checks(SCORE, derive)


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
