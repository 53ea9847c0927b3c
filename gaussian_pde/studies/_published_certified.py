r"""The published histograms against the certified limit of each of their settings.

For every converged attempt of the published replay (:mod:`._published`: setting ``i``
with its :math:`Q` and :math:`V`, and the :math:`\Sigma_0` of draw ``k``) the limit is
computed by :func:`gaussian_pde.certified_limits` with the published conventions
(docs/math.md 9.4: softmax ``Softmax(Q, -Q, V, scale=1/sqrt(d))``, L2
``L2(Q, -Q, V / sqrt(d), scale=1)``). A setting whose published rank :math:`r_p` differs
from the true rank :math:`r` gets one reason, tested in this order:

*threshold*
    the true limit counted with the published threshold 0.1 gives :math:`r_p`: a
    surviving eigenvalue is positive but below 0.1;
*early stop*
    :math:`r_p` exceeds the limit counted at 0.1: the stop test
    :math:`\lVert r\rVert_F < \mathrm{tol}` fired while a vanishing eigenvalue was still
    above 0.1 (for :math:`K = -Q` it decays only like :math:`1/t`);
*scheme*
    otherwise: the Euler iterate with its clipping is not near the limit.

Converged attempts whose rank exceeds :math:`\lceil d/2\rceil` are not recorded by the
script (docs/math.md 9.2); they are listed with the reason *not recorded*.

Every true rank comes with its evidence: the decay exponent of each vanishing eigenvalue
of :math:`\Sigma` (-1 or -2), the growth exponents of the pivots of
:math:`\Sigma^{-1} = LDL^T`, the drift of the conserved :math:`N^T\Sigma^{-1}N`, the
distance of the limit from the closed form :math:`N(N^T\Sigma_0^{-1}N)^{-1}N^T` and the
surviving eigenvalues of the limit (whose smallest, below 0.1, is the evidence of a
*threshold* reason).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .._common.io import write_text
from ..analysis import limit_rank
from ..attention import published_attention
from . import _published as pub
from ._certified import certified_limits

__all__ = ["certify_published", "closed_form_eigenvalues", "compact_table",
           "write_published_certified"]

#: a limit is "at the closed form" when its relative distance from it is below this
CLOSED_FORM_TOL = 1e-3


def decay_class(rates):
    """``"1/t"``, ``"1/t^2"``, ``"1/t and 1/t^2"``...: the decay laws, exponents rounded."""
    laws = sorted({max(int(round(-x)), 0) for x in rates})
    return " and ".join("1/t" if e == 1 else f"1/t^{e}" for e in laws) if laws else "none"


def closed_form_eigenvalues(Q, cov0):
    r"""Eigenvalues of :math:`N(N^T\Sigma_0^{-1}N)^{-1}N^T` on :math:`\ker Q`, ascending.

    The limit itself for :math:`V = I` (docs/math.md 4.5), so its count above 0.1 is the
    *threshold* evidence there without any integration; a lower bound on the limit
    (Loewner order) for any :math:`V`.
    """
    Q = np.asarray(Q, float)
    r = np.linalg.matrix_rank(Q)
    N = np.linalg.svd(Q)[2][r:].T
    return np.linalg.eigvalsh(np.linalg.inv(N.T @ np.linalg.solve(cov0, N)))


def certify_published(paths, progress=None):
    r"""Certified limits of the published replay's settings, panel by panel.

    Parameters
    ----------
    paths : dict
        ``published_histograms(..., return_paths=True)["paths"]``.
    progress : callable or None
        Called with one line when done.

    Returns
    -------
    dict
        ``panels``: per panel the published and true counts, the undecided and
        below-bound counts, the disagreements by reason, the decay classes and every
        setting (published rank, true rank with its evidence, the limit counted at 0.1,
        reason); ``n``, ``certified_s`` (CPU seconds of the certified limits),
        ``certified_s_per_setting``, ``step_us`` (one published step, same run) and
        ``certified_over_step``.
    """
    jobs = []
    for kind, by_val in paths.items():
        settings = pub.published_settings(kind)
        for val, by_d in by_val.items():
            for ds, path in by_d.items():
                d = int(ds)
                qs, vs = settings[d]
                draws = pub._sigma0_draws(d, max(r["draw"] for r in path) + 1)
                for rec in path:
                    if rec["status"] != "converged":
                        continue
                    q = qs[rec["setting"]]
                    v = np.eye(d) if val == "identity" else vs[rec["setting"]]
                    att = published_attention(kind, q, v, d)
                    jobs.append((kind, val, d, rec, att, draws[rec["draw"]]))
    t0 = time.process_time()
    cert = certified_limits([j[4] for j in jobs], [j[5] for j in jobs]) if jobs else []
    cert_s = time.process_time() - t0
    step_s = pub.step_seconds()
    panels = {}
    for (kind, val, d, rec, att, cov0), c in zip(jobs, cert):
        key = f"{kind}_{val}_d{d}"
        p = panels.setdefault(key, dict(type=kind, values=val, d=d, published=[0] * (d + 1),
                                        true=[0] * (d + 1), undecided=0, below_bound=0,
                                        disagree=0, reasons={}, not_recorded=0,
                                        decay={}, closed_form=0, settings=[],
                                        certified_s=0.0))
        rp = int(rec["rank"])
        recorded = rp <= (d + 1) // 2
        rt = c.rank if c.outcome in ("rank", "zero") else -1
        lim01 = int(limit_rank(c.limit, rtol=0.0, atol=pub.RANK_THRESHOLD)) \
            if c.limit is not None else -1
        if recorded:
            p["published"][rp] += 1
        if rt >= 0:
            p["true"][rt] += 1
            p["below_bound"] += int(rt < c.bound)
            cls = decay_class(c.decay_rates)
            p["decay"][cls] = p["decay"].get(cls, 0) + 1
            p["closed_form"] += int(c.closed_form_gap < CLOSED_FORM_TOL)
        else:
            p["undecided"] += 1
        surv = [float(x) for x in c.eigenvalues[d - c.bound:]] if rt >= 0 else []
        closed01 = int(np.sum(closed_form_eigenvalues(att.Q, cov0) > pub.RANK_THRESHOLD))
        if not recorded:
            reason = "not recorded"
            p["not_recorded"] += 1
        elif rt < 0:
            reason = "undecided"
        elif rp == rt:
            reason = "agree"
        elif lim01 == rp:
            reason = "threshold"
        elif rp > lim01:
            reason = "early stop"
        else:
            reason = "scheme"
        if reason not in ("agree", "not recorded", "undecided"):
            p["disagree"] += 1
            p["reasons"][reason] = p["reasons"].get(reason, 0) + 1
        p["settings"].append(dict(setting=int(rec["setting"]), draw=int(rec["draw"]),
                                  published=rp, true=rt, **{"limit_at_0.1": lim01,
                                                            "closed_form_at_0.1": closed01},
                                  reason=reason, outcome=c.outcome, bound=int(c.bound),
                                  decay_rates=[float(x) for x in c.decay_rates],
                                  pivot_exponents=[float(x) for x in
                                                   c.pivot_exponents[:d - c.bound]],
                                  conserved_drift=float(c.conserved_drift),
                                  closed_form_gap=float(c.closed_form_gap),
                                  limit_eigenvalues=surv, steps=int(c.steps),
                                  message=c.message))
    n = len(jobs)
    for p in panels.values():
        p["certified_s"] = cert_s * len(p["settings"]) / max(n, 1)
    if progress is not None:
        progress(f"certified limits of {n} published settings: {cert_s:.1f} s")
    return dict(panels=panels, n=n, certified_s=cert_s,
                certified_s_per_setting=cert_s / max(n, 1), step_us=step_s * 1e6,
                certified_over_step=cert_s / step_s)


_COLUMNS = ["setting", "draw", "published", "true", "limit_at_0.1", "closed_form_at_0.1",
            "reason", "decay_rates", "conserved_drift", "closed_form_gap",
            "min_surviving_eigenvalue"]


def _sig(x, n=3):
    return float(f"{x:.{n}g}") if np.isfinite(x) else None


def compact_table(res):
    """The per-setting table of :func:`certify_published`, a few numbers per setting.

    Returns
    -------
    dict
        Per panel the counts (published, true, undecided, below bound, reasons, decay
        classes, at the closed form) and ``rows``, one list per converged attempt in the
        order of ``columns``.
    """
    out = dict(columns=_COLUMNS, n=res["n"],
               certified_s_per_setting=_sig(res["certified_s_per_setting"]), panels={})
    for key, p in res["panels"].items():
        rows = [[r["setting"], r["draw"], r["published"], r["true"], r["limit_at_0.1"],
                 r["closed_form_at_0.1"], r["reason"], [round(x, 3) for x in r["decay_rates"]],
                 _sig(r["conserved_drift"], 2), _sig(r["closed_form_gap"], 2),
                 _sig(min(r["limit_eigenvalues"]), 3) if r["limit_eigenvalues"] else None]
                for r in p["settings"]]
        out["panels"][key] = {k: p[k] for k in ("type", "values", "d", "published", "true",
                                                "undecided", "below_bound", "disagree",
                                                "reasons", "not_recorded", "decay",
                                                "closed_form")}
        out["panels"][key]["rows"] = rows
    return out


def write_published_certified(out, paths, progress=None):
    """:func:`certify_published` into ``out/published_certified.json``; returns it and the path."""
    res = certify_published(paths, progress=progress)
    path = Path(out) / "published_certified.json"
    write_text(path, json.dumps(res, indent=1) + "\n")   # atomically
    return {**res, "file": str(path)}
