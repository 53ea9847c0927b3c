r"""The coefficients of the package's two step methods, written once.

* :data:`DOP853`: the explicit Dormand-Prince 8(5,3) pair of order 8 with its embedded
  estimates of orders 5 and 3 and its continuous extension of order 7. The numbers are those
  of Hairer's code ``dop853.f`` (E. Hairer, S. P. Norsett and G. Wanner, *Solving Ordinary
  Differential Equations I*, 2nd ed., Springer 1993, section II.10); SciPy's
  ``scipy/integrate/_ivp/dop853_coefficients.py`` (BSD-3-Clause) carries the same digits,
  and the arrays below are built with its arithmetic, so they hold the same floating-point
  numbers as :class:`scipy.integrate.DOP853`.
* :data:`RODAS4P2`: Steinebach's L-stable, stiffly accurate Rosenbrock method of order 4
  (embedded order 3, continuous extension of order 3), the improvement of Rodas4P that
  satisfies further conditions against order reduction on very stiff problems
  (G. Steinebach, "Improvement of Rosenbrock-Wanner method RODASP", in *Progress in
  Differential-Algebraic Equations II*, Springer 2020, pp. 165-184; the digits as the
  Julia package OrdinaryDiffEq.jl tabulates them, in the form of E. Hairer and
  G. Wanner's code ``rodas.f``, *Solving Ordinary Differential Equations II*, 2nd ed.,
  Springer 1996, section IV.7). The compiled engine's stiff steps are this method's.

With them, the constants of the step-size rule that both methods share (:data:`SAFETY`,
:data:`MIN_FACTOR`). The order conditions of both tableaux are checked in
``tests/_common/test_tableaux.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["DOP853", "RODAS4P2", "ExplicitPair", "RosenbrockTableau", "SAFETY", "MIN_FACTOR"]


@dataclasses.dataclass(frozen=True)
class ExplicitPair:
    r"""An explicit Runge-Kutta pair with extra stages for its continuous extension.

    The names are those of SciPy's ``dop853_coefficients`` module, so that a loop reads the
    same against either. With :math:`K_i = f(t + C_i h,\ y + h\sum_{j<i} A_{ij}K_j)`, the
    step is :math:`y_1 = y + h\sum_i B_i K_i`; stage ``N_STAGES`` is :math:`f(t + h, y_1)`
    (its row of ``A`` is ``B``), the stages after it serve the dense output only.

    Attributes
    ----------
    N_STAGES : int
        Stages of one step.
    N_STAGES_EXTENDED : int
        Stages with those of the continuous extension.
    INTERPOLATOR_POWER : int
        Degree of the continuous extension.
    A : ndarray, shape (N_STAGES_EXTENDED, N_STAGES_EXTENDED)
        Stage couplings (strictly lower triangular).
    B : ndarray, shape (N_STAGES,)
        Weights of the solution.
    C : ndarray, shape (N_STAGES_EXTENDED,)
        Nodes, :math:`C_i = \sum_j A_{ij}`.
    E3, E5 : ndarray, shape (N_STAGES + 1,)
        ``B`` less the weights of the embedded solutions of orders 3 and 5 (the last entry
        belongs to the stage :math:`f(t + h, y_1)`).
    D : ndarray, shape (INTERPOLATOR_POWER - 3, N_STAGES_EXTENDED)
        Weights of the dense output's last four coefficients :math:`F_{3..6} = hDK`; with
        :math:`F_0 = y_1 - y`, :math:`F_1 = hK_0 - F_0`, :math:`F_2 = 2F_0 - h(K_0 + K_{12})`,
        :math:`y(t + xh) = y + x(F_0 + (1-x)(F_1 + x(F_2 + (1-x)(F_3 + x(F_4 + (1-x)(F_5 +
        xF_6))))))`.
    """

    N_STAGES: int
    N_STAGES_EXTENDED: int
    INTERPOLATOR_POWER: int
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    E3: np.ndarray
    E5: np.ndarray
    D: np.ndarray


_N_STAGES, _N_EXTENDED, _POWER = 12, 16, 7


#: DOP853's nodes ``C``, the extra stages' included (digits of dop853.f)
_DOP853_C = (
    0.0,
    0.526001519587677318785587544488e-01,
    0.789002279381515978178381316732e-01,
    0.118350341907227396726757197510,
    0.281649658092772603273242802490,
    0.333333333333333333333333333333,
    0.25,
    0.307692307692307692307692307692,
    0.651282051282051282051282051282,
    0.6,
    0.857142857142857142857142857142,
    1.0,
    1.0,
    0.1,
    0.2,
    0.777777777777777777777777777778)

#: DOP853's couplings ``A``: row ``i`` as ``{j: A[i, j]}``, its nonzero entries (dop853.f)
_DOP853_A = {
    1: {0: 5.26001519587677318785587544488e-2},
    2: {0: 1.97250569845378994544595329183e-2, 1: 5.91751709536136983633785987549e-2},
    3: {0: 2.95875854768068491816892993775e-2, 2: 8.87627564304205475450678981324e-2},
    4: {0: 2.41365134159266685502369798665e-1, 2: -8.84549479328286085344864962717e-1,
        3: 9.24834003261792003115737966543e-1},
    5: {0: 3.7037037037037037037037037037e-2, 3: 1.70828608729473871279604482173e-1,
        4: 1.25467687566822425016691814123e-1},
    6: {0: 3.7109375e-2, 3: 1.70252211019544039314978060272e-1,
        4: 6.02165389804559606850219397283e-2, 5: -1.7578125e-2},
    7: {0: 3.70920001185047927108779319836e-2, 3: 1.70383925712239993810214054705e-1,
        4: 1.07262030446373284651809199168e-1, 5: -1.53194377486244017527936158236e-2,
        6: 8.27378916381402288758473766002e-3},
    8: {0: 6.24110958716075717114429577812e-1, 3: -3.36089262944694129406857109825,
        4: -8.68219346841726006818189891453e-1, 5: 2.75920996994467083049415600797e1,
        6: 2.01540675504778934086186788979e1, 7: -4.34898841810699588477366255144e1},
    9: {0: 4.77662536438264365890433908527e-1, 3: -2.48811461997166764192642586468,
        4: -5.90290826836842996371446475743e-1, 5: 2.12300514481811942347288949897e1,
        6: 1.52792336328824235832596922938e1, 7: -3.32882109689848629194453265587e1,
        8: -2.03312017085086261358222928593e-2},
    10: {0: -9.3714243008598732571704021658e-1, 3: 5.18637242884406370830023853209,
         4: 1.09143734899672957818500254654, 5: -8.14978701074692612513997267357,
         6: -1.85200656599969598641566180701e1, 7: 2.27394870993505042818970056734e1,
         8: 2.49360555267965238987089396762, 9: -3.0467644718982195003823669022},
    11: {0: 2.27331014751653820792359768449, 3: -1.05344954667372501984066689879e1,
         4: -2.00087205822486249909675718444, 5: -1.79589318631187989172765950534e1,
         6: 2.79488845294199600508499808837e1, 7: -2.85899827713502369474065508674,
         8: -8.87285693353062954433549289258, 9: 1.23605671757943030647266201528e1,
         10: 6.43392746015763530355970484046e-1},
    12: {0: 5.42937341165687622380535766363e-2, 5: 4.45031289275240888144113950566,
         6: 1.89151789931450038304281599044, 7: -5.8012039600105847814672114227,
         8: 3.1116436695781989440891606237e-1, 9: -1.52160949662516078556178806805e-1,
         10: 2.01365400804030348374776537501e-1, 11: 4.47106157277725905176885569043e-2},
    13: {0: 5.61675022830479523392909219681e-2, 6: 2.53500210216624811088794765333e-1,
         7: -2.46239037470802489917441475441e-1, 8: -1.24191423263816360469010140626e-1,
         9: 1.5329179827876569731206322685e-1, 10: 8.20105229563468988491666602057e-3,
         11: 7.56789766054569976138603589584e-3, 12: -8.298e-3},
    14: {0: 3.18346481635021405060768473261e-2, 5: 2.83009096723667755288322961402e-2,
         6: 5.35419883074385676223797384372e-2, 7: -5.49237485713909884646569340306e-2,
         10: -1.08347328697249322858509316994e-4, 11: 3.82571090835658412954920192323e-4,
         12: -3.40465008687404560802977114492e-4, 13: 1.41312443674632500278074618366e-1},
    15: {0: -4.28896301583791923408573538692e-1, 5: -4.69762141536116384314449447206,
         6: 7.68342119606259904184240953878, 7: 4.06898981839711007970213554331,
         8: 3.56727187455281109270669543021e-1, 12: -1.39902416515901462129418009734e-3,
         13: 2.9475147891527723389556272149, 14: -9.15095847217987001081870187138},
}


def _dop853_stages():
    """DOP853's nodes ``C`` and couplings ``A``, the extra stages' included."""
    C = np.array(_DOP853_C)
    A = np.zeros((_N_EXTENDED, _N_EXTENDED))
    for i, row in _DOP853_A.items():
        for j, value in row.items():
            A[i, j] = value
    return C, A


def _dop853():
    """DOP853's arrays (module docstring: the digits and the arithmetic of dop853.f/SciPy)."""
    n_stages, n_extended, power = _N_STAGES, _N_EXTENDED, _POWER
    C, A = _dop853_stages()
    B = A[n_stages, :n_stages]

    E3 = np.zeros(n_stages + 1)
    E3[:-1] = B.copy()
    E3[0] -= 0.244094488188976377952755905512
    E3[8] -= 0.733846688281611857341361741547
    E3[11] -= 0.220588235294117647058823529412e-1

    E5 = np.zeros(n_stages + 1)
    E5[0] = 0.1312004499419488073250102996e-1
    E5[5] = -0.1225156446376204440720569753e+1
    E5[6] = -0.4957589496572501915214079952
    E5[7] = 0.1664377182454986536961530415e+1
    E5[8] = -0.3503288487499736816886487290
    E5[9] = 0.3341791187130174790297318841
    E5[10] = 0.8192320648511571246570742613e-1
    E5[11] = -0.2235530786388629525884427845e-1
    return ExplicitPair(n_stages, n_extended, power, A, B, C, E3, E5, _dop853_dense())


def _dop853_dense():
    """DOP853's dense-output weights ``D`` (:math:`F_0, F_1, F_2` need none)."""
    power, n_extended = _POWER, _N_EXTENDED
    D = np.zeros((power - 3, n_extended))
    D[0, 0] = -0.84289382761090128651353491142e+1
    D[0, 5] = 0.56671495351937776962531783590
    D[0, 6] = -0.30689499459498916912797304727e+1
    D[0, 7] = 0.23846676565120698287728149680e+1
    D[0, 8] = 0.21170345824450282767155149946e+1
    D[0, 9] = -0.87139158377797299206789907490
    D[0, 10] = 0.22404374302607882758541771650e+1
    D[0, 11] = 0.63157877876946881815570249290
    D[0, 12] = -0.88990336451333310820698117400e-1
    D[0, 13] = 0.18148505520854727256656404962e+2
    D[0, 14] = -0.91946323924783554000451984436e+1
    D[0, 15] = -0.44360363875948939664310572000e+1

    D[1, 0] = 0.10427508642579134603413151009e+2
    D[1, 5] = 0.24228349177525818288430175319e+3
    D[1, 6] = 0.16520045171727028198505394887e+3
    D[1, 7] = -0.37454675472269020279518312152e+3
    D[1, 8] = -0.22113666853125306036270938578e+2
    D[1, 9] = 0.77334326684722638389603898808e+1
    D[1, 10] = -0.30674084731089398182061213626e+2
    D[1, 11] = -0.93321305264302278729567221706e+1
    D[1, 12] = 0.15697238121770843886131091075e+2
    D[1, 13] = -0.31139403219565177677282850411e+2
    D[1, 14] = -0.93529243588444783865713862664e+1
    D[1, 15] = 0.35816841486394083752465898540e+2

    D[2, 0] = 0.19985053242002433820987653617e+2
    D[2, 5] = -0.38703730874935176555105901742e+3
    D[2, 6] = -0.18917813819516756882830838328e+3
    D[2, 7] = 0.52780815920542364900561016686e+3
    D[2, 8] = -0.11573902539959630126141871134e+2
    D[2, 9] = 0.68812326946963000169666922661e+1
    D[2, 10] = -0.10006050966910838403183860980e+1
    D[2, 11] = 0.77771377980534432092869265740
    D[2, 12] = -0.27782057523535084065932004339e+1
    D[2, 13] = -0.60196695231264120758267380846e+2
    D[2, 14] = 0.84320405506677161018159903784e+2
    D[2, 15] = 0.11992291136182789328035130030e+2

    D[3, 0] = -0.25693933462703749003312586129e+2
    D[3, 5] = -0.15418974869023643374053993627e+3
    D[3, 6] = -0.23152937917604549567536039109e+3
    D[3, 7] = 0.35763911791061412378285349910e+3
    D[3, 8] = 0.93405324183624310003907691704e+2
    D[3, 9] = -0.37458323136451633156875139351e+2
    D[3, 10] = 0.10409964950896230045147246184e+3
    D[3, 11] = 0.29840293426660503123344363579e+2
    D[3, 12] = -0.43533456590011143754432175058e+2
    D[3, 13] = 0.96324553959188282948394950600e+2
    D[3, 14] = -0.39177261675615439165231486172e+2
    D[3, 15] = -0.14972683625798562581422125276e+3
    return D


@dataclasses.dataclass(frozen=True)
class RosenbrockTableau:
    r"""Coefficients of a Rosenbrock method in the Hairer-Wanner form.

    Stage :math:`i` solves :math:`(I/(\gamma h) - J)\,U_i = f(y_0 + \sum_j a_{ij}U_j)
    + \sum_j c_{ij}U_j/h`, and the step is :math:`y_1 = y_0 + \sum_i b_i U_i`. In the
    classical form :math:`k_i = hf(y_0 + \sum_j\alpha_{ij}k_j) + hJ\sum_{j\le i}
    \gamma_{ij}k_j` the same method has :math:`\Gamma^{-1} = \operatorname{diag}(1/\gamma)
    - c`, :math:`\alpha = a\Gamma` and the weights :math:`b\Gamma` (Hairer and Wanner,
    section IV.7).

    Attributes
    ----------
    a, c : ndarray, shape (s, s)
        Stage couplings (strictly lower triangular).
    b : ndarray, shape (s,)
        Weights of the solution.
    gamma : float
        Diagonal of the method.
    h : ndarray, shape (2, s)
        The continuous extension :math:`y(t_0 + \theta h) = (1-\theta)y_0 + \theta(y_1 +
        (1-\theta)(\sum_i h_{0i}U_i + \theta\sum_i h_{1i}U_i))`.
    """

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    gamma: float
    h: np.ndarray


def _rodas4p2():
    """RODAS4P2's arrays (module docstring), in ``rodas.f``'s form: stage 6 at stage 5 + ``U_5``."""
    a = np.zeros((6, 6))
    a[1, 0] = 3.0
    a[2, :2] = [0.906377755268814, -0.189707390391685]
    a[3, :3] = [3.758617027739064, 1.161741776019525, -0.849258085312803]
    a[4, :4] = [7.089566927282776, 4.573591406461604, -8.423496976860259, -0.959280113459775]
    a[5, :5] = [*a[4, :4], 1.0]
    b = np.array([*a[5, :5], 1.0])       # stiffly accurate; U_6 the error estimate
    c = np.zeros((6, 6))
    c[1, 0] = -12.0
    c[2, :2] = [-6.354581592719008, 0.338972550544623]
    c[3, :3] = [-8.575016317114033, -7.606483992117508, 12.22499765012482]
    c[4, :4] = [-5.888975457523102, -8.157396617841821, 24.805546872612922, 12.790401512796979]
    c[5, :5] = [-4.408651676063871, -6.692003137674639, 24.625568527593117, 16.627521966636085,
                -5.714285714285718]
    h = np.array([[-5.323528268423303, -10.042123754867493, 17.175254928256965,
                   -5.079931171878093, -0.016185991706112, 0.0],
                  [6.984505741529879, 6.914061169603662, -0.849178943070653, 18.104410789349338,
                   -3.516963011559032, 0.0]])
    return RosenbrockTableau(a=a, b=b, c=c, gamma=0.25, h=h)


#: the Dormand-Prince 8(5,3) pair, for every DOP853 loop of the package
DOP853 = _dop853()
#: the RODAS4P2 coefficients (Hairer-Wanner form): the compiled engine's stiff steps
RODAS4P2 = _rodas4p2()

#: RODAS4P2's arrays under the names the compiled engine reads (``W = I/(gamma h) - J``,
#: ``W U_i = f(y + sum_j a_ij U_j) + sum_j (c_ij/h) U_j``, ``y_1 = y + sum_j b_j U_j``, the
#: error estimate ``U_6``; ``_RH``: the continuous extension)
_RA, _RB, _RC, _RGAMMA, _RH = RODAS4P2.a, RODAS4P2.b, RODAS4P2.c, RODAS4P2.gamma, RODAS4P2.h

#: the step-size rule of both methods (SciPy's DOP853 values): a new step is
#: ``h min(f_max, SAFETY err^e)`` after an accepted step and ``h max(MIN_FACTOR, SAFETY err^e)``
#: after a rejected one, ``e`` the method's error exponent
SAFETY, MIN_FACTOR = 0.9, 0.2
#: a Rosenbrock stage state this many times larger than the step's start rejects the step outright
_WILD = 1e6
