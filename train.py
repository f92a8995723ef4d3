"""Train a Transformer: python train.py --config configs/base.py --workdir runs/base.

The same as `python -m tx train ...`; see tx/cli/__init__.py for every option.
"""

import sys

from tx.__main__ import main, with_huge_pages

if __name__ == "__main__":
    with_huge_pages()
    sys.exit(main(["train", *sys.argv[1:]]))
