"""Tables of the docs, computed at build time from the JSON in ``docs/_static/results/``.

Each public function returns a list whose items are a paragraph (``str``) or a table
``(header, rows, caption)``. Where the data come from (the command that wrote them) is
said in the list, so a reader can regenerate every number.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "_static" / "results"

_PANELS = [("softmax", "identity", "softmax, V = I"), ("softmax", "random", "softmax, V = R^T R"),
           ("l2", "identity", "L2, V = I"), ("l2", "random", "L2, V = R^T R")]

_SOURCES = {
    "published_counts": ["reproduce/published_histograms.json",
                         "reproduce/published_certified.json"],
    "certified_reasons": ["reproduce/published_certified.json"],
    "trust_summary": ["clusters/trust.json"],
    "stabilizer_cells": ["stabilizers/summary.json"],
    "training_budgets": ["benchmarks/bench_training.json"],
}


def sources(name):
    """The files a table is built from (Sphinx rebuilds the page when one changes)."""
    if name == "benchmarks":
        return sorted((RESULTS / "benchmarks").glob("*.json"))
    return [RESULTS / p for p in _SOURCES.get(name, [])]


def _load(rel):
    path = RESULTS / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python docs/make_results.py` "
                                f"(see docs/_static/results/README.md)")
    return json.loads(path.read_text())


def _counts(c):
    return " ".join(str(int(x)) for x in c)


def published_counts():
    """Rank counts of the published replay next to the certified true limit, per panel."""
    hist = _load("reproduce/published_histograms.json")
    cert = _load("reproduce/published_certified.json")
    ds = sorted({d for k, v, _ in _PANELS for d in hist[k][v]}, key=int)
    rows = []
    for kind, val, label in _PANELS:
        row = [label]
        for d in ds:
            true = cert["panels"][f"{kind}_{val}_d{d}"]["true"]
            row += [_counts(hist[kind][val][d]), _counts(true)]
        rows.append(row)
    header = ["panel"] + [f"d = {d}, {w}" for d in ds for w in ("published", "true")]
    return [("Counts of the limit ranks 0..d over the 100 settings of each panel: the "
             "published script replayed (`published_histograms.json`), and the certified "
             "true limit of the same attempts (`published_certified.json`)."),
            (header, rows, "Published replay against the true limit"),
            f"Written by `gaussian-pde reproduce --protocol published` ({cert['n']} "
            f"settings certified; record dated {cert.get('date', 'unknown')})."]


def certified_reasons():
    """Per panel: why the published count differs from the true one, and the decay laws."""
    cert = _load("reproduce/published_certified.json")
    reasons = sorted({r for p in cert["panels"].values() for r in p["reasons"]})
    rows = []
    total = {r: 0 for r in reasons}
    for p in cert["panels"].values():
        label = f"{p['type']}, V = {'I' if p['values'] == 'identity' else 'R^T R'}, d = {p['d']}"
        for r in reasons:
            total[r] += p["reasons"].get(r, 0)
        decay = ", ".join(f"{k}: {v}" for k, v in sorted(p["decay"].items()))
        rows.append([label, *[p["reasons"].get(r, 0) for r in reasons], p["not_recorded"],
                     p["undecided"], p["below_bound"], decay, p["closed_form"]])
    header = ["panel", *reasons, "not recorded", "undecided", "below d - rank Q",
              "decay of the vanishing eigenvalues", "at the closed form"]
    n_dis = sum(total.values())
    return [(header, rows, "Disagreements with the published counts, by reason"),
            f"{cert['n']} settings; the published count differs from the true one in "
            f"{n_dis} (" + ", ".join(f"{r}: {total[r]}" for r in reasons) + ")."]


def trust_summary():
    """The closure's trust map: trusted / unresolved / biased cells per attention type."""
    tr = _load("clusters/trust.json")
    tol = tr["tol"]
    by = {}
    for c in tr["cells"]:
        k = by.setdefault(c["kind"], {"cells": 0, "trusted": 0, "biased": 0, "max_bias": 0.0})
        k["cells"] += 1
        if c["hi"] < tol:
            k["trusted"] += 1
        elif c["lo"] > tol:
            k["biased"] += 1
        k["max_bias"] = max(k["max_bias"], c["bias"])
    rows = [[kind, v["cells"], v["trusted"], v["cells"] - v["trusted"] - v["biased"],
             v["biased"], f"{v['max_bias']:.3g}"] for kind, v in by.items()]
    g = tr["grid"]
    return [(["attention", "cells", "trusted", "unresolved", "biased", "largest bias"], rows,
             "Where the mixture closure can be trusted"),
            f"Trusted: the 90% interval of the relative bias lies below {tol}; biased: it lies "
            f"above. Grid: q in {g['q']}, radius in {g['radius']}, d in {g['d']}, "
            f"{g['seeds']} runs at n = {g['n']} and at 4n. Written by "
            f"`gaussian-pde clusters --trust` ({tr['seconds']:.0f} s)."]


def stabilizer_cells():
    """The stabiliser study's cells and claims, from its ``summary.json``."""
    s = _load("stabilizers/summary.json")
    out = []
    cells = s.get("cells", {})
    if cells:
        keys = sorted({k for v in cells.values() for k, x in v.items()
                       if isinstance(x, (int, float, bool))})
        rows = [[name, *[_fmt(v.get(k)) for k in keys]] for name, v in cells.items()]
        out.append((["cell", *keys], rows, "Stabiliser study: one row per cell"))
    claims = s.get("claims", {})
    if claims:
        rows = [[name, "holds" if c.get("holds") else "fails",
                 ", ".join(f"{k} {_fmt(v)}" for k, v in c.items()
                           if k != "holds" and isinstance(v, (int, float)))]
                for name, c in claims.items()]
        out.append((["claim", "verdict", "evidence"], rows, "Claims"))
    out.append("Written by `gaussian-pde stabilizers` into docs/_static/results/stabilizers.")
    return out


def _fmt(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def _written_by(rec):
    """A benchmark record's provenance: its command, date, machine and versions."""
    m, v = rec["machine"], rec["versions"]
    return (f"written by `python benchmarks/{rec['command']}` on {rec['date']}; "
            f"{m.get('cpu')}, {m.get('cores')} cores; "
            + ", ".join(f"{k} {x}" for k, x in v.items() if x) + ".")


def benchmarks():
    """Every benchmark record: its tables, the command, date, machine and versions."""
    out = []
    files = sorted((RESULTS / "benchmarks").glob("*.json"))
    if not files:
        return ["No benchmark record yet: run the scripts in benchmarks/ (each writes "
                "docs/_static/results/benchmarks/NAME.json)."]
    for path in files:
        rec = json.loads(path.read_text())
        out.append(f"{rec['benchmark']}: {_written_by(rec)}")
        res = rec["results"]
        scalars = [[k, _fmt(x)] for k, x in res.items()
                   if isinstance(x, (int, float, str, bool)) and k not in ("tables", "notes")]
        if scalars:
            out.append((["quantity", "value"], scalars, rec["benchmark"]))
        for t in res.get("tables", []):
            out.append((t["columns"], t["rows"], t.get("title") or rec["benchmark"]))
        for line in rec["results"].get("notes", []):
            out.append(line)
    return out


def training_budgets():
    """The training study's wall and CPU time against its budgets (``bench_training``)."""
    rec = _load("benchmarks/bench_training.json")
    line = _written_by(rec)
    out = [line[0].upper() + line[1:]]
    for t in rec["results"].get("tables", []):
        if "budget s" in t["columns"]:
            out.append((t["columns"], t["rows"], t["title"]))
    return out


def attention_types():
    """The registered attention types and what each can do (read from the registry)."""
    import gaussian_pde as gp

    def yes(v):
        return "yes" if v is True else ("no" if v in (False, None) else str(v))

    rows = [[name, f"gp.{cls.__name__}", yes(getattr(cls, "gaussian_preserving", None)),
             yes(getattr(cls, "exact_jacobian", None)), yes(getattr(cls, "field_sees_mean", None)),
             yes(getattr(cls, "closure", None))]
            for name, cls in gp.ATTENTIONS.items()]
    return [(["name", "class", "keeps Gaussians Gaussian", "exact Jacobian",
              "field matrix sees the mean", "closure when not exact"], rows,
             "The registered attention types"),
            "Read from `gp.ATTENTIONS` when the site is built: a type registered with "
            "`gp.register_attention` appears here."]
