"""``python -m pycuda_heads``: the ``pycuda-heads`` command."""
import sys

from .cli import main

sys.exit(main())
