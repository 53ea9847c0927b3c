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
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..analysis import limit_rank
from ..attention._l2 import L2
from ..attention._softmax import Softmax
from . import _published as pub
from ._certified import certified_limits

__all__ = ["certify_published", "write_published_certified"]


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
        ``panels``: per panel the published and true counts, the disagreements by reason
        and every setting (published rank, true rank, the limit counted at 0.1, reason);
        ``n``, ``certified_s`` (time of the certified limits), ``step_us`` (one published
        step, same run) and ``certified_over_step``.
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
                    att = (Softmax(q, -q, v, scale=1.0 / np.sqrt(d)) if kind == "softmax"
                           else L2(q, -q, v / np.sqrt(d), scale=1.0))
                    jobs.append((kind, val, d, rec, att, draws[rec["draw"]]))
    t0 = time.perf_counter()
    cert = certified_limits([j[4] for j in jobs], [j[5] for j in jobs]) if jobs else []
    cert_s = time.perf_counter() - t0
    step_s = pub.step_seconds()
    panels = {}
    for (kind, val, d, rec, _, _), c in zip(jobs, cert):
        key = f"{kind}_{val}_d{d}"
        p = panels.setdefault(key, dict(type=kind, values=val, d=d, published=[0] * (d + 1),
                                        true=[0] * (d + 1), undecided=0, disagree=0,
                                        reasons={}, not_recorded=0, settings=[],
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
        else:
            p["undecided"] += 1
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
                                  published=rp, true=rt, **{"limit_at_0.1": lim01},
                                  reason=reason, outcome=c.outcome,
                                  decay_rates=[float(x) for x in c.decay_rates],
                                  conserved_drift=float(c.conserved_drift),
                                  message=c.message))
    n = len(jobs)
    for p in panels.values():
        p["certified_s"] = cert_s * len(p["settings"]) / max(n, 1)
    if progress is not None:
        progress(f"certified limits of {n} published settings: {cert_s:.1f} s")
    return dict(panels=panels, n=n, certified_s=cert_s, step_us=step_s * 1e6,
                certified_over_step=cert_s / step_s)


def write_published_certified(out, paths, progress=None):
    """:func:`certify_published` into ``out/published_certified.json``; returns it and the path."""
    res = certify_published(paths, progress=progress)
    path = Path(out) / "published_certified.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    return {**res, "file": str(path)}
