"""python3 -m tutti.convert: the `tutti convert` command line."""
import sys

from .cli import main

sys.exit(main())
