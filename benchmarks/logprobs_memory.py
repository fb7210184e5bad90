"""The update's scoring pass at a real vocabulary size: what ``policy_logprobs`` runs through the
output layer and the softmax, in its three forms.

Chat-mode rows hold several turns each, at other columns in each row, so the columns where *some*
row has a response token are most of the row, while each row's own responses are a fraction of
it. Three sides, each one forward and backward of the same batch in its own process:

- ``columns``: until 2026-12-07 (morning), the output layer on the kept columns ([B, C, V] logits),
  cast to fp32, divided by the temperature and put through the softmax whole;
- ``softmax``: 2026-12-07 (evening), the output layer on the kept columns, the softmax on the [N, V]
  response positions only;
- ``now``: the output layer and the softmax on the [N, V] response positions only
  (``objectives.position_logits``).

The model is a random-init Qwen3 with Qwen3's 151,936-token vocabulary (``--vocab``) and a small
body (``--hidden``, ``--layers``), so the output layer's share is what it is at 0.6B-1.7B. Peak is
the process's resident high-water mark (``ru_maxrss``) minus its mark before the pass.

    python benchmarks/logprobs_memory.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def kept_columns_softmax(model, batch):
    """``policy_logprobs`` until 2026-12-07 (morning): the softmax over every kept column."""
    import torch

    B, L = batch.response_mask.shape
    cols = batch.response_mask.any(dim=0).nonzero().squeeze(1)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=cols,
                   use_cache=False).logits.float()
    logits = logits / batch.temperature[:, None, None]
    logp = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, cols + 1]
    sampled = torch.zeros((B, L), dtype=logp.dtype)
    return sampled.index_copy(1, cols, logp.gather(2, targets[:, :, None]).squeeze(2))


def kept_columns_output_layer(model, batch):
    """``policy_logprobs`` of 2026-12-07 (evening): the output layer on every kept column, the
    softmax on the response positions."""
    import torch
    from agentkit.objectives import sampled_distribution

    B, L = batch.response_mask.shape
    cols = batch.response_mask.any(dim=0).nonzero().squeeze(1)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=cols,
                   use_cache=False).logits  # [B, C, V]
    rows, kept = (batch.response_mask[:, cols] > 0).nonzero(as_tuple=True)
    columns = cols[kept]
    logp = sampled_distribution(logits[rows, kept], batch.temperature[rows])
    targets = batch.input_ids[rows, columns + 1]
    return torch.zeros((B, L)).index_put((rows, columns), logp.gather(1, targets[:, None]).squeeze(1))


SIDES = {"columns": ("the output layer and the softmax on every kept column (until 2026-12-07)", kept_columns_softmax),
         "softmax": ("the output layer on every kept column, the softmax on the response positions",
                     kept_columns_output_layer),
         "now": ("the output layer and the softmax on the response positions (now)", None)}


def one_side(args) -> dict:
    import torch
    from agentkit.objectives import TokenBatch, policy_logprobs
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=args.hidden // 8, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)
    B, L = args.rows, args.tokens - 1
    response = torch.zeros((B, L))
    turn_tokens = args.tokens // args.turns
    for b in range(B):  # each row's turns: an observation, then a response, shifted per row
        offset = b * turn_tokens // B
        for t in range(args.turns):
            start = offset + t * turn_tokens + turn_tokens - args.response_tokens
            response[b, max(0, start): min(L, start + args.response_tokens)] = 1.0
    batch = TokenBatch(input_ids=torch.randint(0, args.vocab, (B, L + 1)), attention_mask=torch.ones((B, L + 1), dtype=torch.long),
                       response_mask=response, old_logprobs=torch.zeros((B, L)), advantages=torch.zeros((B, L)),
                       weights=response.clone(), episode_index=torch.arange(B), turn_index=torch.full((B, L), -1),
                       temperature=torch.ones(B))
    score = SIDES[args.side][1] or policy_logprobs
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    (score(model, batch) * batch.response_mask).sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kept = int(response.any(dim=0).sum())
    return {"side": args.side, "pass_peak_gb": (peak - before) / 1e6, "seconds": seconds,
            "kept_columns": kept, "response_positions": int(response.sum()), "rows": B, "row_tokens": args.tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2048, help="Tokens per row (one chat-mode episode).")
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--response-tokens", type=int, default=32, help="Response tokens per turn.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(one_side(args)))
        return
    results = []
    for side in SIDES:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--side", side], capture_output=True, text=True,
                             check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = results[0]
    print(f"\n{first['rows']} rows x {first['row_tokens']} tokens, {args.turns} turns of {args.response_tokens} response "
          f"tokens per row: {first['kept_columns']} kept columns, {first['response_positions']} response positions; "
          f"vocabulary {args.vocab}\n")
    print("| scoring pass | pass peak GB | forward + backward s |")
    print("| --- | --- | --- |")
    for r, (name, _) in zip(results, SIDES.values(), strict=True):
        print(f"| {name} | {r['pass_peak_gb']:.2f} | {r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
