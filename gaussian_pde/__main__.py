"""``python -m gaussian_pde`` is the ``gaussian-pde`` command."""

from ._cli import main

raise SystemExit(main())
