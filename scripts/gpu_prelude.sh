# Sourced by the scripts/gpu_*.sh device scripts (bash, the repository root as the working directory):
# install the carried wheels (.whl: into the interpreter's own site-packages, where the Triton server is
# looked up), stop there when INSTALL_ONLY=1 (a first call that carries only the big wheel), put the
# repository on PYTHONPATH, fill one Triton kernel cache from the carried .kernel_cache/*.tgz (compiled
# kernels of an earlier run: minutes of first compiles saved; a stale one is only unused) and write the
# Kimi-Linear-48B-shaped checkpoint once per machine.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && exit 0
export PYTHONPATH=$PWD
CACHE=/tmp/triton_cache
mkdir -p $CACHE
for t in .kernel_cache/*.tgz; do
  [ -f "$t" ] && tar xzf "$t" -C /tmp && cp -rn /tmp/kernels/. $CACHE/ 2>/dev/null
done
export TRITON_CACHE_DIR=$CACHE
[ -f /tmp/kimi48/model.safetensors ] || python3 benchmarks/shaped_model.py /tmp/kimi48 --device cuda || exit 4
