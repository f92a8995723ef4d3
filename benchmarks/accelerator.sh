#!/usr/bin/env bash
# The accelerator benchmark of issue 15: base and big training (bf16, fused and explicit
# attention: step time, tokens/s, MFU, peak memory) and beam-4 decoding, into one JSON.
#   bash benchmarks/accelerator.sh            on the device (planned to stay under 8 minutes on
#                                             one H200: four compiles of about a minute; not
#                                             yet timed there, no device was lent so far)
#   bash benchmarks/accelerator.sh --dry-run  tiny shapes on any backend (CI runs this)
# Further arguments go to benchmarks/accelerator.py (--steps N, --out FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" benchmarks/accelerator.py "$@"
