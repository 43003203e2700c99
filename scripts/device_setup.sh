# Sourced at the start of a device run: the wheels the GPU image lacks (made by
# ../shared/device/prepare-wheels.sh, carried as .whl), the project in editable mode with its C
# parts built, and NVLink multicast kept off in NCCL, PyTorch and NVSHMEM (a program that uses it
# can take a shared host's GPUs out of service). Sourcing it again in the same machine only sets
# the environment, so parallel lanes of one run do not install over each other.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PATH="$HOME/.local/bin:/usr/local/cuda/bin:$PATH"
if [ -d .whl ]; then
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  [ -e /tmp/site/.installed ] || {
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.installed
  } || return 1
fi
[ -e /tmp/.replayfmt-installed ] || {
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 \
    && touch /tmp/.replayfmt-installed
} || { cat /tmp/install.log; return 1; }
