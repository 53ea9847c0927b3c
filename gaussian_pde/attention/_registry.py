"""The one registry of attention types: name -> class.

The CLI, sweeps and tests iterate over :data:`ATTENTIONS`. A new type registers itself
with :func:`register_attention` (see docs/adding_an_attention_type.md). What a type can
do is read off what it implements (:func:`capabilities`), never declared beside it:
``exact_jacobian`` is "its compiled field has a closed-form Jacobian", ``closure`` is ``"quadrature"``
for a type that implements ``gaussian_closure_field`` and ``"block_causal"`` for one
that uses positions. Code that needs types with a given capability filters the registry,
e.g. :func:`names_with`.
"""

from __future__ import annotations

from ._base import Attention, has_hook
from ._l2 import L2
from ._masked import Masked
from ._multihead import MultiHead
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax

__all__ = ["ATTENTIONS", "DEFAULT_ATTENTION", "ENTRY_POINT_GROUP", "get_attention", "register_attention",
           "names_with", "capabilities", "load_entry_points"]

#: name -> attention class
ATTENTIONS: dict[str, type[Attention]] = {
    "softmax": Softmax,
    "l2": L2,
    "sinkhorn": Sinkhorn,
    "multihead": MultiHead,
    "sigmoid": Sigmoid,
    "masked": Masked,
}

#: the type a sweep or a study integrates when none is named: softmax, the attention of
#: the Transformer
DEFAULT_ATTENTION = "softmax"

#: the contract's optional hooks, whose implementation is a capability
_HOOKS = ("compiled_field", "mean_generator", "riccati_matrix", "scalar_solution", "quadratic_score",
          "mixture_field", "gaussian_closure_field", "definition_field", "example_setting",
          "field_matrix_with_mean", "from_heads")


#: capabilities read off the class, and what a type implements to have them
_DERIVED = {"exact_jacobian": "supply a `compiled_field` whose Jacobian kernel has a closed form",
            "closure": "implement `gaussian_closure_field`, or set `uses_positions`",
            "field_sees_mean": "implement `field_matrix_with_mean`"}


def capabilities(cls):
    """What ``cls`` can do, read off what it implements.

    Returns
    -------
    dict
        ``gaussian_preserving``, ``uses_positions`` (declared booleans), the derived
        ``exact_jacobian``, ``closure`` and ``field_sees_mean``, and, per optional hook of
        the contract, whether the class implements it.
    """
    caps = dict(gaussian_preserving=cls.gaussian_preserving, uses_positions=cls.uses_positions,
                exact_jacobian=cls.exact_jacobian, closure=cls.closure,
                field_sees_mean=cls.field_sees_mean)
    caps.update({hook: has_hook(cls, hook) for hook in _HOOKS})
    return caps


def _check_capabilities(cls):
    """What ``cls`` implements is well formed and consistent (else an error)."""
    where = f"attention type {cls.__name__} ({cls.name!r})"
    for attr, hook in _DERIVED.items():
        for base in cls.__mro__[:cls.__mro__.index(Attention)]:
            if attr in vars(base):
                raise TypeError(f"{where}: `{attr}` is derived from what the type implements "
                                f"({hook}), not declared; remove `{attr} = ...` from "
                                f"{base.__name__}.")
    for attr in ("gaussian_preserving", "uses_positions"):
        if not isinstance(getattr(cls, attr), bool):
            raise TypeError(f"{where}: `{attr}` must be True or False, got "
                            f"{getattr(cls, attr)!r}.")
    if cls.gaussian_preserving and cls.closure is not None:
        raise ValueError(f"{where}: a Gaussian-preserving type has exact moment equations; "
                         f"it must not use positions or define `gaussian_closure_field` "
                         f"(closure {cls.closure!r}).")
    if cls.field_sees_mean and not cls.gaussian_preserving:
        raise ValueError(f"{where}: `field_matrix_with_mean` needs exact moment equations "
                         "(`gaussian_preserving = True`).")
    if has_hook(cls, "compiled_field") and not cls.gaussian_preserving:
        raise ValueError(f"{where}: `compiled_field` needs exact moment equations "
                         "(`gaussian_preserving = True`).")
    if not has_hook(cls, "particle_kernel"):
        raise TypeError(f"{where} has no particle kernel: define "
                        "`particle_kernel(self, x, opts)` (see gaussian_pde.Attention).")


def register_attention(cls):
    """Add an attention class to the registry under ``cls.name`` (usable as a decorator).

    The class must subclass :class:`~gaussian_pde.Attention`, have booleans
    ``gaussian_preserving`` and ``uses_positions``, a particle kernel
    ``particle_kernel``, and implement ``compiled_field`` only with exact moment
    equations (:func:`capabilities`).
    """
    if not (isinstance(cls, type) and issubclass(cls, Attention)):
        raise TypeError(f"`cls` must be a subclass of gaussian_pde.Attention, got {cls!r}.")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError("`cls.name` must be a non-empty string.")
    _check_capabilities(cls)
    ATTENTIONS[cls.name] = cls
    return cls


def names_with(**wanted):
    """Registered names whose class has the given :func:`capabilities`, in registry order.

    >>> names_with(gaussian_preserving=False)
    ['sigmoid', 'masked']
    """
    unknown = set(wanted) - set(_HOOKS) - set(_DERIVED) - {"gaussian_preserving",
                                                           "uses_positions"}
    if unknown:
        raise ValueError(f"unknown capabilities {sorted(unknown)}: expected keys of "
                         "`capabilities(cls)`.")
    # each capability asked for only (exact_jacobian reads a compiled field)
    return [name for name, cls in ATTENTIONS.items()
            if all((has_hook(cls, k) if k in _HOOKS else getattr(cls, k)) == v
                   for k, v in wanted.items())]


#: modules of this package that are not attention types
_INFRASTRUCTURE = {"_base", "_compiled_fields", "_examples", "_kernels", "_moments",
                   "_registry", "_scores", "_studies", "_transformer"}


def _discover():
    """Import every type module of this package: a type registers itself on import.

    A new type is one file, ``attention/_<name>.py``, whose class is decorated with
    :func:`register_attention`; nothing here lists it.
    """
    import importlib
    import pkgutil

    package = __name__.rsplit(".", 1)[0]
    path = importlib.import_module(package).__path__
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name.startswith("_") and info.name not in _INFRASTRUCTURE:
            importlib.import_module(f"{package}.{info.name}")


#: the entry-point group through which other packages register attention types
ENTRY_POINT_GROUP = "gaussian_pde.attentions"


def load_entry_points():
    """Register the attention classes that installed packages advertise.

    A package lists its classes in the entry-point group ``gaussian_pde.attentions``
    (``name = module:Class``, e.g. in ``setup.cfg``: ``[options.entry_points]
    gaussian_pde.attentions = mytype = mypkg.attention:MyType``). Each is loaded and
    registered (:func:`register_attention`) unless a type of that name already is. An
    entry point that cannot be loaded, or that is not an attention class, is reported
    with a ``RuntimeWarning`` and skipped: a broken plugin does not break the package.
    A plugin module that is being imported (it was imported before this package, and
    imports it) is skipped: such a module calls :func:`register_attention` on its class
    itself, as the example ``examples/keynorm_plugin`` does.
    Called at the end of ``import gaussian_pde``, so that a plugin may import anything of
    the package's public face; call it again after installing a package in a running
    process.

    Returns
    -------
    list of str
        The names registered by this call.
    """
    import warnings
    from importlib.metadata import entry_points

    added = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if _importing(ep.module):
            continue        # the plugin imported first imports this package: it registers
        try:                # its class itself once defined (register_attention)
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Attention)):
                raise TypeError(f"it is {cls!r}, not a subclass of gaussian_pde.Attention")
            if ATTENTIONS.get(cls.name) is cls:
                continue
            if cls.name in ATTENTIONS:
                raise ValueError(f"a type named {cls.name!r} is already registered")
            register_attention(cls)
        except Exception as exc:  # noqa: BLE001 - any failure of a plugin is reported
            warnings.warn(f"entry point {ep.name!r} ({ep.value}) of group "
                          f"{ENTRY_POINT_GROUP!r} was not registered: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        added.append(cls.name)
    return added


def _importing(module):
    """Whether ``module`` is being imported now (it imported this package first)."""
    import sys

    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def get_attention(name):
    """The attention class registered under ``name``."""
    if isinstance(name, type) and issubclass(name, Attention):
        return name
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a string, got {type(name).__name__}.")
    try:
        return ATTENTIONS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown attention type {name!r}; "
                         f"known types: {', '.join(ATTENTIONS)}.") from None


_discover()
