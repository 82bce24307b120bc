#!/usr/bin/env bash
# The whole GPU check as one device run (bench/GPU_CHECK.md): the node check and the tiny job with every
# GPU-only variant (bench/gpu_node.py), then the recipe against the HF Trainer and TRL (bench/trainer.py,
# one round). Needs the wheels of bench/gpu_wheels.sh in .whl/; each script's JSON line lands in $OUT.
#   device run: bash bench/gpu_check.sh      carry: [".whl"]      timeout_s: 560 (it takes about 6 minutes)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT" /tmp/site /tmp/site-bench
for w in .whl/bitsandbytes-*.whl .whl/pydantic*.whl .whl/annotated_types-*.whl .whl/typing_*.whl; do
  python3 -m zipfile -e "$w" /tmp/site
done
for w in .whl/trl-*.whl .whl/datasets-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl; do
  python3 -m zipfile -e "$w" /tmp/site-bench
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
started=$(date +%s)
PYTHONPATH=/tmp/site timeout 270 python3 bench/gpu_node.py --allow-missing ray,wandb,datasets > "$OUT/gpu_node.log" 2>&1
echo "gpu_node: exit $? after $(($(date +%s) - started)) s"
tail -1 "$OUT/gpu_node.log" > "$OUT/gpu_node.json"
grep -E "variant |steps on|NOT OK|^gpu_node: OK" "$OUT/gpu_node.log"
started=$(date +%s)
PYTHONPATH=/tmp/site:/tmp/site-bench timeout 230 python3 bench/trainer.py --rounds 1 --timeout 100 > "$OUT/trainer.log" 2>&1
echo "trainer: exit $? after $(($(date +%s) - started)) s"
tail -1 "$OUT/trainer.log" > "$OUT/trainer.json"
grep "bench.trainer:" "$OUT/trainer.log" | tail -5
