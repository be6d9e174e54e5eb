"""One vLLM engine process for test_vllm_forward.py: vLLM's CPU build serves
one token-id prompt greedily with tierkv as its KV connector (or with none)
and prints one JSON line: the output tokens, how many prompt tokens came from
the cache (vLLM's num_cached_tokens), vLLM's connector hit counters and
tierkv's own vllm:tierkv_* metrics, read from vLLM's Prometheus registry.

    python vllm_forward_child.py MODEL_DIR SOCKET TOKEN MODE [DAEMON_PID]

MODE: none (no connector), tierkv, or kill: tierkv, and the scheduler side
SIGKILLs tierkvd right after it matched the prompt and allocated its blocks
(before the worker loads them), so the load fails mid-request.
"""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# A 2-core machine: one OpenMP thread, not bound ("auto" reserves cores).
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tierkv.vllm import TierkvConnector  # noqa: E402

PROMPT = [(7 * i + 3) % 997 + 3 for i in range(3 * 64 + 10)]
BLOCK = 64


class KillingTierkvConnector(TierkvConnector):
    """TierkvConnector whose scheduler kills tierkvd once a load is planned:
    a daemon dying between Match and load, on purpose."""

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        pid = self._kv_transfer_config.kv_connector_extra_config.get(
            "kill_pid")
        if num_external_tokens > 0 and pid:
            os.kill(int(pid), signal.SIGKILL)
            print(f"killed tierkvd (pid {pid}) after matching "
                  f"{num_external_tokens} tokens", file=sys.stderr)


def main() -> None:
    model, socket, token, mode = sys.argv[1:5]
    kill_pid = sys.argv[5] if len(sys.argv) > 5 else None
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = None
    if mode != "none":
        kv = KVTransferConfig(
            kv_connector=("KillingTierkvConnector" if mode == "kill"
                          else "TierkvConnector"),
            kv_connector_module_path=("vllm_forward_child" if mode == "kill"
                                      else "tierkv.vllm"),
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"socket": socket,
                                       "namespace": "default",
                                       "token": token, "kill_pid": kill_pid,
                                       "retry_s": 60.0})
    llm = LLM(model=model, load_format="safetensors", skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", seed=0, block_size=BLOCK,
              max_model_len=512, max_num_seqs=2, max_num_batched_tokens=512,
              kv_cache_memory_bytes=64 << 20, enable_prefix_caching=True,
              disable_log_stats=False, kv_transfer_config=kv)
    out = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)],
                       SamplingParams(temperature=0.0, max_tokens=8,
                                      ignore_eos=True, detokenize=False),
                       use_tqdm=False)[0]
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith(("vllm:external_prefix_cache", "vllm:tierkv_",
                              "vllm:prefix_cache")):
            metrics[m.name] = getattr(m, "value", None)
    print("RESULT " + json.dumps({
        "mode": mode, "pid": os.getpid(), "vllm": vllm.__version__,
        "torch": torch.__version__, "tokens": list(out.outputs[0].token_ids),
        "finish_reason": out.outputs[0].finish_reason,
        "prompt_tokens": len(PROMPT),
        "num_cached_tokens": out.num_cached_tokens, "metrics": metrics}),
        flush=True)


if __name__ == "__main__":
    main()
