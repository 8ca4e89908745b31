#!/usr/bin/env bash
# H200: GPU tests of the kernels and the fla model path after the engine-seam change, then the cold/warm
# benchmark on a Kimi-Linear-48B-shaped checkpoint. Run through the device tool with .whl carried.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -m pytest -q -x tests/state tests/model/test_fla_gpu.py -p no:cacheprovider > "$OUT/test_gpu_h200.log" 2>&1
tail -3 "$OUT/test_gpu_h200.log"
python3 benchmarks/shaped_model.py /tmp/kimi48 --device cuda
python3 benchmarks/warm_start.py --model /tmp/kimi48 --out "$OUT/warm_start_h200.json" "$@"
