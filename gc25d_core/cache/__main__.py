"""``python -m gc25d_core.cache verify|inspect|publish|import|serve`` (see gc25d_core.cache.cli)."""

import sys

from gc25d_core.cache.cli import main

if __name__ == "__main__":
    sys.exit(main())
