#!/usr/bin/env bash
# H200, call A of a fresh machine (carry [".whl_a", ".whl"]: .whl_a holds nvidia-pytriton packed by
# scripts/gpu/pack_wheel.sh, which the prelude installs; .whl holds fla-core): then the codecs' GPU tests and the
# GPU test files that build their checkpoints with transformers. Those must run before any serving call: it installs
# numpy 1.26 for the Triton Python stub, and transformers then no longer imports (np.long). One pytest per file,
# each under PER_FILE_S, so one slow or hung file cannot take the call. TEST_FILES overrides the list.
#   bash scripts/gpu/first_call.sh
# The serving call that follows (matched_cells.sh's header) carries [".whl_c", ".kernel_cache"]: two calls stage a
# fresh machine.
SHAPED_MODEL=0
source scripts/gpu/prelude.sh
# whether flashinfer's JIT could build its fused MoE here (docs/performance.md: why no flashinfer arm)
echo "nvcc: $(command -v nvcc || echo none); CUDA dirs: $(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')"
# the codecs' GPU tests first (a few seconds: each codec's codes against torch's near every rounding boundary,
# through the hardware conversions the stores take on a GPU; the mixed layout's segments and the one-launch
# stores against torch), then the files that need transformers. The
# late-compile test (tests/engine/test_late_compiles_gpu.py, ~150 s, a cold kernel cache) passed at 92a133c and
# every cells call's server log names a late compile: name it in TEST_FILES after warm-up changes
FILES=${TEST_FILES:-"tests/state/test_codecs_fp8_int4.py tests/state/test_state_kernels.py tests/state/test_conv8.py tests/state/test_mixed_pool.py tests/state/test_state_launches.py tests/model/test_model_recurrence.py tests/model/test_decode_graphs.py"}
for f in $FILES; do
  echo "== $f"
  timeout "${PER_FILE_S:-240}" python3 -m pytest --tb=short -q -p no:cacheprovider -W ignore "$f" 2>&1 \
    | grep -v "Warning\|np.uintc" | tail -40
done
