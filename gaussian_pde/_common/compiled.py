"""Kernel functions written as plain Python and compiled by Numba when first needed.

The mark lives here, below the attention types and the generated modules, so that
``gaussian_pde/_generated`` (whose head bodies are printed by ``derivations/``) can mark
its functions without importing the attention package;
:mod:`gaussian_pde.attention._compiled_fields` compiles what is marked.

The integrator (:mod:`gaussian_pde.integrate._compiled_engine`) calls its large pieces,
each compiled once, through their addresses (:func:`address_caller`), and hands the
field kernels to its driver by an address looked up once (:class:`ResolvedKernel`).

Numba's disk cache checks the source file of the function it compiles, not those of the
functions and constants it compiles in from other modules; the names of the compiled
functions carry a stamp of those sources instead (:func:`sources_stamp`,
:func:`imported_sources`, :func:`stamped`), so that an edit of any of them compiles
them again.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import os
import types

__all__ = ["MARKED", "compiled_later", "address_caller", "address_and_signature",
           "ResolvedKernel", "engine_field_kernels", "imported_sources", "sources_stamp",
           "stamped"]

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


def address_caller(signatures):
    """An intrinsic ``call(table, place, *args)``: the compiled function at ``table[place]``.

    ``table`` is an int64 array of addresses of functions compiled with Numba's calling
    convention, ``place`` a constant, ``signatures[place]`` that function's signature
    (read when a caller is compiled). A direct call of the code at that address, the
    arguments cast to the signature, its exceptions propagated to the caller. The
    address comes from the caller (an argument, not a constant), so that every caller
    stays in Numba's disk cache. (Numba's first-class functions would serve too, but each
    of their calls also compiles a fallback through a C pointer that passes named tuples
    by value, which costs more compilation than the call.)
    """
    from numba import types as T
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def call(typingctx, table, which, *args):
        if not isinstance(which, T.IntegerLiteral):
            return None
        place = which.literal_value
        sig = signatures[place]

        def codegen(context, builder, signature, llargs):
            array = context.make_array(table)(context, builder, llargs[0])
            addr = builder.load(builder.gep(array.data, [context.get_constant(T.intp, place)]))
            values = [context.cast(builder, builder.extract_value(llargs[2], i), ty, to)
                      for i, (ty, to) in enumerate(zip(args, sig.args))]
            fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
            status, res = context.call_conv.call_function(
                builder, builder.inttoptr(addr, fnty.as_pointer()), sig.return_type,
                sig.args, values)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return res

        return sig.return_type(table, which, T.StarArgTuple.from_types(args)), codegen

    return call


def address_and_signature(dispatcher):
    """``(address, signature)`` of a dispatcher's one compiled function, for :func:`address_caller`."""
    (sig,) = dispatcher.nopython_signatures
    cres = dispatcher.get_compile_result(sig)
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name), sig


class ResolvedKernel:
    """A compiled kernel passed to a compiled driver by its address, looked up once.

    Numba's wrapper-address protocol (``__wrapper_address__``, ``signature``): a
    dispatcher passed as a first-class function is looked up again at every call of the
    driver (about 30 us each, as long as a short trajectory); this object hands over the
    address found at the first. It holds the dispatcher, which owns the code.
    """

    def __init__(self, kernel, sig):
        from numba import types as T
        from numba.experimental.function_type import _get_wrapper_address

        self.kernel = kernel
        self.sig = sig
        self.address = _get_wrapper_address(kernel, sig)
        self._numba_type_ = T.FunctionType(sig)

    def __wrapper_address__(self):
        return self.address

    def signature(self):
        return self.sig


def engine_field_kernels(namespace, helpers, signatures, fast=()):
    """A plain-state field module's ``(rhs, jac)``, compiled for the engine (Numba, cached).

    The module's ``helpers`` (names in ``namespace``, its globals) are compiled in place,
    so their uncompiled source stays at ``py_func`` (the tests run it) and ``rhs`` and
    ``jac`` call the compiled code; then ``namespace["rhs"]`` and ``namespace["jac"]`` with
    the engine's kernel ``signatures`` ``(rhs_sig, jac_sig)``. The helpers named in
    ``fast`` may have their sums reassociated (``fastmath``: reassoc, contract).
    """
    import numba

    for name in helpers:
        if not hasattr(namespace[name], "py_func"):
            opts = {"fastmath": {"reassoc", "contract"}} if name in fast else {}
            namespace[name] = numba.njit(cache=True, error_model="numpy", **opts)(namespace[name])
    rhs_sig, jac_sig = signatures
    return (numba.njit(rhs_sig, cache=True, error_model="numpy")(namespace["rhs"]),
            numba.njit(jac_sig, cache=True, error_model="numpy")(namespace["jac"]))


def sources_stamp(paths, *names):
    """A 16-digit hex digest of the files ``paths`` (each one's size and modification time) and ``names``.

    In the names of compiled functions cached on disk (:func:`stamped`): it changes
    with any edit of a file (or a newer copy of it), where Numba's own check reads
    only the file that defines the function.
    """
    h = hashlib.sha1()
    for name in names:
        h.update(name.encode())
    for path in sorted(set(map(str, paths))):
        try:
            st = os.stat(path)
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:             # not a file (a zipped install): its name alone
            h.update(path.encode())
    return h.hexdigest()[:16]


def imported_sources(modules, within):
    """The source files of ``modules`` and of the modules they import from ``within``, transitively.

    ``modules``: module names; ``within``: name prefixes (such as
    ``"gaussian_pde.integrate"``): the imports followed, read from each module's source
    (its top-level ``import`` and ``from ... import`` statements, relative ones
    resolved; ``from package import name`` counts the module ``package.name`` where
    there is one, else the package). For the stamp of a compiled function whose code
    reads functions and constants of those modules.
    """
    def name_is_package(name):
        spec = importlib.util.find_spec(name)
        return spec is not None and spec.submodule_search_locations is not None

    seen, todo, files = set(), list(modules), set()
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith(tuple(within)):
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        files.add(spec.origin)
        package = name if spec.submodule_search_locations else name.rpartition(".")[0]
        for node in _top_level_imports(spec.origin):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                   package) if node.level else node.module
                is_package = name_is_package(base)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    todo.append(sub if is_package and importlib.util.find_spec(sub) else base)
    return files


def _top_level_imports(path):
    """The top-level import statements of the Python file ``path`` (AST nodes).

    Only the statements are parsed (those starting a line, with their parenthesised
    continuation lines), not the whole file: a tenth of the time. A line of a docstring
    that parses as an import counts as one (a file more in a stamp, never one less).
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    nodes, i = [], 0
    while i < len(lines):
        if lines[i].startswith(("import ", "from ")):
            j = i
            if "(" in lines[i] and ")" not in lines[i]:
                while ")" not in lines[j] and j + 1 < len(lines):
                    j += 1
            try:
                nodes += ast.parse("\n".join(lines[i:j + 1])).body
                i = j
            except SyntaxError:         # a line of a docstring: not a statement
                pass
        i += 1
    return nodes


@functools.cache
def stamped(fn, stamp):
    """A copy of the plain function ``fn`` named ``<name>_<stamp>`` (same code, same globals).

    Compiled with ``cache=True``, it is cached on disk under that name: a new ``stamp``
    (:func:`sources_stamp`) compiles it anew instead of loading code compiled from older
    sources. One copy per function and stamp.
    """
    copy = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_{stamp}",
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = f"{fn.__qualname__}_{stamp}"
    copy.__doc__ = fn.__doc__
    copy.__dict__.update(fn.__dict__)
    return copy
