#!/usr/bin/env bash
# The wheels a bare GPU machine lacks for bench/gpu_node.py's variants (bench/GPU_CHECK.md), into .whl/
# (ignored by git; carried to the machine with the repository): bitsandbytes, and pydantic with its own
# dependencies (trainer.config needs it). The versions are those of this repository's .venv-node.
#   bash bench/gpu_wheels.sh            # PYTHON_VERSION=3.12 by default: the GPU machine's python3
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
LIMIT_MIB=60  # what a device run carries is 64 MiB in all
# trl, datasets, dill, multiprocess: bench/trainer.py's third trainer (TRL's SFTTrainer); gpu_check.sh puts
# them on the path of bench/trainer.py alone (the node check runs without datasets, as on a bare node).
WHEELS=(
  trl==1.16.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
  bitsandbytes==0.50.2
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
)
python=${PYTHON:-.venv/bin/python}
mkdir -p .whl
# bitsandbytes is tagged manylinux_2_24, pydantic-core manylinux2014 (2_17): both platforms are named.
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl/*.whl
total=$(du -cm .whl/*.whl | tail -1 | cut -f1)
echo "gpu_wheels: ${total} MiB in .whl/"
if [ "$total" -gt "$LIMIT_MIB" ]; then
  echo "gpu_wheels: over ${LIMIT_MIB} MiB: too big to carry (remove other wheels from .whl/)" >&2
  exit 1
fi
