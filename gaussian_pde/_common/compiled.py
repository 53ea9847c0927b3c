"""Kernel functions written as plain Python and compiled by Numba when first needed.

The mark lives here, below the attention types and the generated modules, so that
``gaussian_pde/_generated`` (whose head bodies are printed by ``derivations/``) can mark
its functions without importing the attention package;
:mod:`gaussian_pde.attention._compiled_fields` compiles what is marked.
"""

from __future__ import annotations

__all__ = ["MARKED", "compiled_later"]

#: the functions marked by :func:`compiled_later`, in the order of their definition
MARKED = []


def compiled_later(inline=False, counted=False):
    """Mark a plain-Python kernel function, compiled by Numba when a field first needs it.

    The function stays plain Python (the tests run it so) until
    :func:`gaussian_pde.attention._compiled_fields._compile_marked` replaces it, in its
    module, by its Numba dispatcher; the kernels that call it then call the compiled
    code. ``inline``: inlined in Numba's IR into its callers (their constants reach its
    loops); ``counted``: it allocates or returns arrays, so it is compiled with Numba's
    reference counting (the others are compiled without it).
    """
    def mark(fn):
        fn.compile_options = dict(inline="always" if inline else "never", _nrt=bool(counted))
        MARKED.append(fn)
        return fn
    return mark
