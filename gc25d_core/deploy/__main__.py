"""``python -m gc25d_core.deploy`` (see gc25d_core.deploy.cli)."""

import sys

from gc25d_core.deploy.cli import main

if __name__ == "__main__":
    sys.exit(main())
