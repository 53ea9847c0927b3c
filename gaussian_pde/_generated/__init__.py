"""Numeric right-hand sides generated from the SymPy derivations in ``derivations/``.

Do not edit: regenerate with ``python derivations/generate.py``.
"""
