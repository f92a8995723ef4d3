"""`python -m tx COMMAND ...`: the command line lives in tx.cli."""

import sys

from tx.cli import main

if __name__ == "__main__":
    sys.exit(main())
