"""``python -m jit_mla``: see ``jit_mla.cli``."""

from jit_mla.cli import main

raise SystemExit(main())
