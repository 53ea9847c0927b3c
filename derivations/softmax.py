r"""Softmax attention: derivation of the Gaussian moment equations.

Score :math:`s(x, y) = c\,\langle Qx, Ky\rangle = y^T A x` with :math:`A = c\,K^TQ`.
The score is linear in ``y`` (``H = 0``), so the tilted Gaussian has mean
:math:`\alpha + \Sigma A x` and the velocity field is affine:

.. math::

    M = c\,V\Sigma K^TQ = V\Sigma A,\qquad b = V\alpha,

    \alpha' = V(\alpha + \Sigma A\alpha),\qquad \Sigma' = V\Sigma A\Sigma + \Sigma A^T\Sigma V^T.

Run ``python derivations/softmax.py`` to print the derivation and its checks.
"""

from __future__ import annotations

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "softmax"
TITLE = "Softmax attention"
SCORE = S.scale * (S.Q * S.x).T * (S.K * S.y)


def derive():
    """The affine field of softmax attention against a Gaussian."""
    return S.quadratic_score_field(SCORE)


def functions():
    """Generated-code functions (see :func:`derivations._symbolic.affine_functions`)."""
    return S.affine_functions(derive(), TITLE)


CHECKS = S.integration_checks(SCORE, derive)


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
