"""``python -m gaussian_pde`` is the ``gaussian-pde`` command."""

from .cli._main import main

raise SystemExit(main())
