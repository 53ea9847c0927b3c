"""The picture of docs/architecture.md: attention types, field forms, step loops, clients.

The boxes and arrows are data (:data:`TYPES`, :data:`FIELDS`, :data:`LOOPS`,
:data:`CLIENTS`, :data:`ARROWS`): every box names the files it stands for, and every arrow
the name by which its head reaches its tail (a hook of the attention contract, or the
loop's entry point). ``tests/test_docs.py`` checks both against the code: the files
exist, and the code of each arrow's user names what the arrow says. ``docs/conf.py``
draws the picture at build time (:func:`draw`); alone::

    python docs/_ext/gp_architecture.py OUT.png
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple


class Box(NamedTuple):
    """One box: a key, a title, lines of text, the files it stands for."""

    key: str
    title: str
    lines: tuple[str, ...]
    files: tuple[str, ...] = ()


class Arrow(NamedTuple):
    """``tail -> head``; ``via``: the names by which the ``user`` end ("head" or "tail") uses the other."""

    tail: str
    head: str
    via: tuple[str, ...]
    user: str = "head"
    label: str = ""
    label_at: float = 0.5
    extra_files: tuple[str, ...] = ()


#: resolution of the PNG: the page scales it to its column, a click opens it whole
DPI = 200

# loop colours (arrows into and out of a loop take its colour)
_C = {"nb": "#d62728", "ev": "#2ca02c", "rk": "#8c564b",
      "type": "#555555"}

TYPES = [
    Box("types", "built-in types",
        ("attention/_<type>.py", "contract: _base.py", "registry: _registry.py"),
        ("gaussian_pde/attention/_base.py", "gaussian_pde/attention/_registry.py",
         "gaussian_pde/attention/_softmax.py")),
    Box("plugin", "a plugin's type",
        ("entry point group", "gaussian_pde.attentions"),
        ("gaussian_pde/attention/_registry.py",)),
]

FIELDS = [
    Box("gen", "generated NumPy",
        ("_generated/<type>.py", "generated, weights()"),
        ("gaussian_pde/_generated/softmax.py", "derivations/generate.py")),
    Box("cf", "CompiledField (Numba)",
        ("_compiled_fields.py", "compiled_field()"),
        ("gaussian_pde/attention/_compiled_fields.py",)),
    Box("hooks", "NumPy hooks",
        ("field_matrix, factor_rhs,", "moment_rhs (default:", "the generated functions)"),
        ("gaussian_pde/attention/_softmax.py", "gaussian_pde/attention/_base.py")),
    Box("quad", "quadratic score",
        ("attention/_scores.py", "quadratic_score"),
        ("gaussian_pde/attention/_scores.py",)),
    Box("pk", "particle kernel",
        ("attention/_kernels.py", "particle_kernel"),
        ("gaussian_pde/attention/_kernels.py",)),
]

LOOPS = [
    Box("nb", "compiled engine",
        ("integrate/_compiled_engine.py,", "_steppers.py: DOP853, RODAS4P2", "Numba; factor or plain states"),
        ("gaussian_pde/integrate/_compiled_engine.py", "gaussian_pde/integrate/_steppers.py")),
    Box("ev", "event loop",
        ("integrate_system: _event_loop.py,", "_moment_field.py",
         "scipy.integrate.solve_ivp; auto: LSODA"),
        ("gaussian_pde/integrate/_event_loop.py", "gaussian_pde/integrate/_moment_field.py")),
    Box("rk", "particle steps",
        ("particles/_simulate.py,", "_common/runge_kutta.py"),
        ("gaussian_pde/particles/_simulate.py", "gaussian_pde/_common/runge_kutta.py")),
]

SHARED = Box("shared", "shared below the loops",
             ("_common/tableaux.py: the DOP853 and RODAS4P2 coefficients (compiled engine)",
              "integrate/_events.py: blow-up, steady state, rank collapse (compiled engine, "
              "event loop, particles)",
              "_common/factor_rotation.py: re-factoring L -> LW (compiled engine, event loop); "
              "_common/lu.py: the LU of the Rosenbrock stages"),
             ("gaussian_pde/_common/tableaux.py", "gaussian_pde/integrate/_events.py",
              "gaussian_pde/_common/factor_rotation.py", "gaussian_pde/_common/lu.py"))

CLIENTS = [
    Box("batch", "gp.solve_batch", ("integrate/_batch.py",), ("gaussian_pde/integrate/_batch.py",)),
    Box("solve", "gp.solve", ("integrate/_solve.py",), ("gaussian_pde/integrate/_solve.py",)),
    Box("closure", "Gaussian closures", ("closure/_engine.py,", "_masked.py"),
        ("gaussian_pde/closure/_engine.py", "gaussian_pde/closure/_masked.py")),
    Box("mixture", "mixture closure", ("closure/_mixture.py",), ("gaussian_pde/closure/_mixture.py",)),
    Box("depth", "depth stacks", ("closure/_depth.py", "(continuous mode)"),
        ("gaussian_pde/closure/_depth.py",)),
    Box("certified", "certified limits", ("studies/_certified.py,", "_certified_field.py (log time)"),
        ("gaussian_pde/studies/_certified.py", "gaussian_pde/studies/_certified_field.py")),
    Box("particles", "particles", ("particles/_simulate.py",), ("gaussian_pde/particles/_simulate.py",)),
]

# user "head": the head's code names ``via`` (a loop calls a hook of the type, a client
# its loop); user "tail": the tail's (the contract, attention/_base.py, has the hook)
ARROWS = [
    Arrow("types", "gen", ("generated",), user="tail"),
    Arrow("types", "cf", ("compiled_field",), user="tail"),
    Arrow("plugin", "cf", ("CompiledField", "signatures")),
    Arrow("types", "hooks", ("field_matrix", "factor_rhs"), user="tail"),
    Arrow("types", "quad", ("quadratic_score",), user="tail"),
    Arrow("types", "pk", ("particle_kernel",), user="tail"),
    Arrow("cf", "nb", ("compiled_field_of",)),
    Arrow("cf", "ev", ("compiled_field_of",)),
    Arrow("hooks", "ev", ("factor_rhs", "moment_rhs")),
    Arrow("quad", "ev", ("quadratic_heads",), label="mixture", extra_files=("gaussian_pde/closure/_mixture.py",)),
    Arrow("quad", "certified", ("quadratic_heads",)),
    Arrow("pk", "rk", ("particle_kernel",)),
    Arrow("nb", "batch", ("integrate_batch",)),
    Arrow("nb", "solve", ("integrate_one",), label="auto", label_at=0.72),
    Arrow("ev", "solve", ("integrate_system",)),
    Arrow("ev", "closure", ("integrate_system",)),
    Arrow("nb", "closure", ("solve",), label="attention", label_at=0.7),
    Arrow("ev", "mixture", ("integrate_system",)),
    Arrow("ev", "depth", ("solve_closure",)),
    Arrow("nb", "certified", ("integrate_states",), label="plain", label_at=0.9),
    Arrow("rk", "particles", ("rk4_step",)),
    Arrow("rk", "depth", ("rk4_step",), label="particles", label_at=0.22),
]


def boxes():
    """Every box, by key."""
    return {b.key: b for b in [*TYPES, *FIELDS, *LOOPS, SHARED, *CLIENTS]}


def user_files(arrow):
    """The files whose code must name the arrow's ``via``: its user's, and its ``extra_files``."""
    return boxes()[getattr(arrow, arrow.user)].files + arrow.extra_files


def _colour(arrow):
    if arrow.head in _C:
        return _C[arrow.head]
    if arrow.tail in _C:
        return _C[arrow.tail]
    return _C["type"]


def _draw_arrows(ax, geom, fs_text):
    """The :data:`ARROWS` between the boxes placed at ``geom``, with their labels."""
    from matplotlib.patches import FancyArrowPatch

    # arrows: spread the attachment points along each edge, ordered by the other end
    outs, ins = {}, {}
    for a in ARROWS:
        outs.setdefault(a.tail, []).append(a)
        ins.setdefault(a.head, []).append(a)

    def centre_y(key):
        x, y, w, h = geom[key]
        return y + h / 2

    def attach(key, group, other, side):
        x, y, w, h = geom[key]
        group = sorted(group, key=lambda a: -centre_y(getattr(a, other)))
        n = len(group)
        span = min(h * 0.7, 0.14 * (n - 1)) if n > 1 else 0.0
        pts = {}
        for i, a in enumerate(group):
            yy = y + h / 2 + span / 2 - (span * i / (n - 1) if n > 1 else 0.0)
            pts[id(a)] = (x + (w if side == "right" else 0.0), yy)
        return pts

    start, end = {}, {}
    for key, group in outs.items():
        start.update(attach(key, group, "head", "right"))
    for key, group in ins.items():
        end.update(attach(key, group, "tail", "left"))
    for a in ARROWS:
        (x1, y1), (x2, y2) = start[id(a)], end[id(a)]
        ax.add_patch(FancyArrowPatch((x1, y1), (x2, y2), arrowstyle="-|>", mutation_scale=8,
                                     color=_colour(a), lw=1.0,
                                     shrinkA=0, shrinkB=1))
        if a.label:
            # the label on the arrow, at ``label_at`` of the way, clear of its neighbours
            t = a.label_at
            ax.text(x1 + t * (x2 - x1), y1 + t * (y2 - y1), a.label, ha="center", va="center",
                    fontsize=fs_text - 1.0, color=_colour(a),
                    bbox=dict(fc="white", ec="none", pad=0.4))


def draw(path):
    """Draw the picture into ``path`` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    W, H = 7.8, 7.0
    fig = plt.figure(figsize=(W, H), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, W)
    ax.set_ylim(0, H)
    ax.axis("off")

    fs_title, fs_text, fs_head = 8.4, 7.6, 9.4
    line_h = 0.15
    cols = {"types": (0.05, 1.5), "fields": (1.85, 1.68), "loops": (3.83, 2.0),
            "clients": (6.13, 1.62)}
    heads = {"types": "attention types", "fields": "field forms", "loops": "step loops",
             "clients": "clients"}
    top = H - 0.55
    for name, (x0, w) in cols.items():
        ax.text(x0 + w / 2, H - 0.28, heads[name], ha="center", va="center", fontsize=fs_head,
                fontweight="bold")

    geom = {}

    def place(column, items, y_top, gap, fill):
        x0, w = cols[column]
        y = y_top
        for b in items:
            h = 0.22 + line_h * (len(b.lines) + 1)
            geom[b.key] = (x0, y - h, w, h)
            ax.add_patch(FancyBboxPatch((x0, y - h), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                        fc=fill.get(b.key, "#f4f4f4"), ec="#333333", lw=0.8))
            ax.text(x0 + 0.08, y - 0.1, b.title, ha="left", va="top", fontsize=fs_title,
                    fontweight="bold")
            for i, ln in enumerate(b.lines):
                ax.text(x0 + 0.08, y - 0.12 - line_h * (i + 1), ln, ha="left", va="top",
                        fontsize=fs_text, family="DejaVu Sans")
            y -= h + gap

    loop_fill = {k: matplotlib.colors.to_rgba(c, 0.13) for k, c in _C.items()}
    place("types", TYPES[:1], top - 1.3, 0.0, {})
    place("types", TYPES[1:], top - 3.2, 0.0, {"plugin": "#fff7e0"})
    place("fields", FIELDS, top, 0.2, {})
    place("loops", LOOPS, top, 0.22, loop_fill)
    place("clients", CLIENTS, top, 0.13, {})

    # the shared modules: a bar along the bottom
    x0, w = cols["types"][0], cols["clients"][0] + cols["clients"][1] - cols["types"][0]
    h = 0.22 + line_h * (len(SHARED.lines) + 1)
    y = 0.12
    geom["shared"] = (x0, y, w, h)
    ax.add_patch(FancyBboxPatch((x0, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                fc="#eeeeee", ec="#333333", lw=0.8, ls="--"))
    ax.text(x0 + 0.08, y + h - 0.1, SHARED.title, ha="left", va="top", fontsize=fs_title,
            fontweight="bold")
    for i, ln in enumerate(SHARED.lines):
        ax.text(x0 + 0.08, y + h - 0.12 - line_h * (i + 1), ln, ha="left", va="top",
                fontsize=fs_text)

    _draw_arrows(ax, geom, fs_text)
    ax.text(0.05, geom["shared"][1] + geom["shared"][3] + 0.15,
            "arrow colour: the loop\nthat it feeds or serves", fontsize=fs_text, va="bottom",
            color="#444444")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python docs/_ext/gp_architecture.py OUT.png\n")
        sys.exit(2)
    draw(sys.argv[1])
