"""vLLM weight sync and sleep/wake on one GPU, with the policy trained in bf16 beside the engine.

    python benchmarks/gpu/engine.py --model DIR --weight-sync ipc --results results.jsonl

Builds ``VLLMBackend`` (bf16, sleep mode on) and the policy as ``agentkit train`` does
(``agentkit.train.load_policy``: bf16 mixed precision on the GPU), then times, ``--repeats``
times each: ``sync_weights`` (``--weight-sync``: ``ipc`` sends CUDA IPC handles to the engine in
its own process; ``direct`` hands the tensors to the engine in this process; ``file`` writes and
reloads a checkpoint), the served logprobs' distance from the module's after a sync
(``sync_error``), and ``sleep(level=1)`` / ``wake_up()``. Writes one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def timed(fn, repeats: int) -> list[float]:
    import torch

    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--weight-sync", default="ipc", choices=["ipc", "direct", "file"])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results", help="Append the result as one JSON line to this file.")
    args = parser.parse_args()

    import torch
    from agentkit.rollout.vllm_backend import VLLMBackend

    from agentkit.train import load_policy
    from agentkit.train.config import TrainSection

    if not torch.cuda.is_available():
        print("engine.py needs a GPU (vLLM's sleep mode and ipc weight sync are GPU-only).")
        return 0
    started = time.perf_counter()
    backend = VLLMBackend(args.model, weight_sync=args.weight_sync, enable_sleep_mode=True, dtype="bfloat16",
                          gpu_memory_utilization=args.gpu_memory_utilization)
    engine_s = time.perf_counter() - started
    policy = load_policy(Path(args.model), TrainSection(precision="bf16"), device="cuda").eval()
    probe = list(range(5, 133))
    sync = timed(lambda: backend.sync_weights(policy), args.repeats)
    error = backend.sync_error(policy, probe)
    sleep = timed(lambda: backend.sleep(level=1), 1)
    wake = timed(lambda: backend.wake_up(), 1)
    for _ in range(args.repeats - 1):
        sleep += timed(lambda: backend.sleep(level=1), 1)
        wake += timed(lambda: backend.wake_up(), 1)
    backend.sync_weights(policy)  # after a wake-up the weights are the engine's own again: still the policy's
    error_after_wake = backend.sync_error(policy, probe)
    result = {"weight_sync": args.weight_sync, "engine_start_s": engine_s,
              "parameters": sum(p.numel() for p in policy.parameters()),
              "sync_s_median": statistics.median(sync), "sync_s": sync, "sync_error": error,
              "sleep_s_median": statistics.median(sleep), "wake_s_median": statistics.median(wake),
              "sync_error_after_wake": error_after_wake, "gpu": torch.cuda.get_device_name()}
    print(json.dumps(result))
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps(result) + "\n")
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
