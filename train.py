"""Train a Transformer: python train.py --config configs/base.py --workdir runs/base.

The same as `python -m tx train ...`; `python -m tx train --help` lists every option.
"""

import sys

from tx.__main__ import main, with_malloc_tunables

if __name__ == "__main__":
    with_malloc_tunables("train")
    sys.exit(main(["train", *sys.argv[1:]]))
