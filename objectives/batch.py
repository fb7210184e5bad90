"""From trajectories to padded token tensors that every objective shares.

A row is one sequence the policy is run on: a whole episode in chat mode (every turn's context
and response ids concatenated, exactly as sampled) or one turn in window mode. Tensors are over
*target* positions: column t holds token ``input_ids[:, t + 1]`` predicted from the prefix up to t,
so ``logprobs[b, t] = log pi(input_ids[b, t + 1] | input_ids[b, : t + 1])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from agentkit.core.errors import ModelError
from agentkit.core.trajectory import Trajectory


@dataclass(frozen=True)
class TokenBatch:
    """Everything an objective's loss needs, padded to ``[B, L]`` (L = longest row - 1).

    Attributes:
        input_ids: [B, L+1] token ids (right-padded with 0).
        attention_mask: [B, L+1] 1 on real tokens.
        response_mask: [B, L] 1 where the target token is a sampled response token.
        old_logprobs: [B, L] logprobs recorded at sampling (0 elsewhere).
        advantages: [B, L] per-token advantage (0 where unused).
        weights: [B, L] per-token weight (1 on response tokens unless an objective says otherwise).
        episode_index: [B] which trajectory each row came from (rows of one episode in window mode).
        turn_index: [B, L] turn number of each target token (-1 outside responses).
        ref_logprobs: [B, L] a frozen reference's logprobs, when the objective asks for them.
        behaviour_logprobs: [B, L] the sampler's own logprobs (the engine's, as recorded in the
            trajectories) when ``old_logprobs`` were recomputed by the trainer (``with_trainer_old_logprobs``).
        is_weights: [B, L] importance weights pi_old / pi_behaviour (truncated or masked) that every
            policy-gradient term is multiplied by; None = 1 (the sampler is the trained policy).
        teacher_logprobs: [B, L] the teacher's logprob of each sampled token (distillation objectives).
        teacher_top1: [B, L] the teacher's top-1 logprob at each response position.
        teacher_support_ids: [B, L, K] the teacher's top-k ids (None with a full-vocabulary support).
        teacher_support_logprobs: [B, L, K or V] the teacher's logprobs over that support.
        metrics: diagnostics computed while preparing (judge label shares, ...), logged per step.
        signals: per-token diagnostics for the viewer, each [B, L] (SDAR's gate at sampling time,
            SAGE-OPD's turn labels and confidences); recorded for a sample of episodes per step.
        temperature: [B] the temperature each row's responses were sampled at (1 for greedy
            rows): ``policy_logprobs`` scores at it, so the ratio to the recorded logprobs starts at 1.
        episode_tokens: [B] response tokens of the row's episode in the whole optimizer minibatch
            (sequence-mean divides by it, whichever micro-batch the row lands in).
        token_normalizer: response tokens in the whole optimizer minibatch (token-mean).
        sequence_normalizer: episodes in the whole minibatch (sequence-mean).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    episode_index: torch.Tensor
    turn_index: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    teacher_top1: torch.Tensor | None = None
    teacher_support_ids: torch.Tensor | None = None
    teacher_support_logprobs: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    signals: dict[str, torch.Tensor] = field(default_factory=dict)
    temperature: torch.Tensor | None = None
    episode_tokens: torch.Tensor | None = None
    token_normalizer: float = 1.0
    sequence_normalizer: float = 1.0

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def rows(self, index: Sequence[int] | torch.Tensor) -> TokenBatch:
        """A sub-batch of rows, trimmed to its own longest row; normalizers are kept."""
        index = torch.as_tensor(index, dtype=torch.long)
        length = int(self.attention_mask[index].sum(dim=1).max().item())
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "signals":
                values[f.name] = {k: v[index][:, : length - 1] for k, v in value.items()}
                continue
            if not isinstance(value, torch.Tensor):
                values[f.name] = value
                continue
            value = value[index]
            if value.dim() >= 2:
                value = value[:, : length if f.name in ("input_ids", "attention_mask") else length - 1]
            values[f.name] = value
        return TokenBatch(**values)

    def with_normalizers(self) -> TokenBatch:
        """Set the normalizers from this batch (call on a whole optimizer minibatch, before it is
        split into micro-batches or shared between processes)."""
        unique, inverse = torch.unique(self.episode_index, return_inverse=True)
        per_row = self.response_mask.sum(dim=1)  # [B]
        per_episode = torch.zeros(len(unique), dtype=per_row.dtype).index_add(0, inverse, per_row)  # [E]
        return replace(self, token_normalizer=max(1.0, float(self.num_response_tokens)),
                       sequence_normalizer=max(1.0, float(len(unique))), episode_tokens=per_episode[inverse])

    def micro_batches(self, max_tokens: int) -> list[TokenBatch]:
        """Split into micro-batches whose padded size (rows x longest row) stays within ``max_tokens``
        (a single longer row is its own micro-batch). Rows are grouped by length to waste less padding."""
        lengths = self.attention_mask.sum(dim=1).tolist()
        order = sorted(range(self.num_rows), key=lambda i: lengths[i])
        chunks, current = [], []
        for i in order:
            longest = max([lengths[j] for j in current] + [lengths[i]])
            if current and longest * (len(current) + 1) > max_tokens:
                chunks.append(current)
                current = []
            current.append(i)
        if current:
            chunks.append(current)
        return [self.rows(chunk) for chunk in chunks]


@dataclass(frozen=True)
class _Row:
    ids: list[int]
    response: list[bool]
    old_logprobs: list[float]
    turns: list[int]
    episode: int


def trajectory_rows(trajectories: Sequence[Trajectory]) -> list[_Row]:
    """One row per episode (chat) or per turn (window), response positions marked."""
    rows = []
    for episode, traj in enumerate(trajectories):
        if traj.one_sequence:
            ids, response, old, turns = [], [], [], []
            for t, turn in enumerate(traj.turns):
                ids += turn.context_ids + turn.response_ids
                response += [False] * len(turn.context_ids) + [True] * len(turn.response_ids)
                old += [0.0] * len(turn.context_ids) + list(turn.response_logprobs)
                turns += [-1] * len(turn.context_ids) + [t] * len(turn.response_ids)
            if ids:
                rows.append(_Row(ids, response, old, turns, episode))
        else:
            for t, turn in enumerate(traj.turns):
                ids = turn.context_ids + turn.response_ids
                rows.append(_Row(ids, [False] * len(turn.context_ids) + [True] * len(turn.response_ids),
                                 [0.0] * len(turn.context_ids) + list(turn.response_logprobs),
                                 [-1] * len(turn.context_ids) + [t] * len(turn.response_ids), episode))
    return rows


def build_batch(trajectories: Sequence[Trajectory], episode_advantages: Sequence[float] | None = None) -> TokenBatch:
    """Pad the trajectories' rows into a ``TokenBatch``; each episode's advantage goes to all its
    response tokens (0 when ``episode_advantages`` is None)."""
    rows = trajectory_rows(trajectories)
    if not rows:
        raise ValueError("no tokens to train on: every trajectory is empty")
    width = max(len(r.ids) for r in rows)
    batch, length = len(rows), width - 1
    input_ids = torch.zeros((batch, width), dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    response = torch.zeros((batch, length), dtype=torch.float32)
    old = torch.zeros((batch, length), dtype=torch.float32)
    turn_index = torch.full((batch, length), -1, dtype=torch.long)
    advantages = torch.zeros((batch, length), dtype=torch.float32)
    for b, row in enumerate(rows):
        n = len(row.ids)
        input_ids[b, :n] = torch.tensor(row.ids)
        attention[b, :n] = 1
        # the target at column t is token t+1
        response[b, : n - 1] = torch.tensor(row.response[1:], dtype=torch.float32)
        old[b, : n - 1] = torch.tensor(row.old_logprobs[1:])
        turn_index[b, : n - 1] = torch.tensor(row.turns[1:])
        if episode_advantages is not None:
            advantages[b, : n - 1] = float(episode_advantages[row.episode])
    advantages = advantages * response
    temperatures = [sampling_temperature(t) for t in trajectories]
    return TokenBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=response, old_logprobs=old,
        advantages=advantages, weights=response.clone(), turn_index=turn_index,
        episode_index=torch.tensor([r.episode for r in rows], dtype=torch.long),
        temperature=torch.tensor([temperatures[r.episode] for r in rows], dtype=torch.float32),
    ).with_normalizers()


def sampling_temperature(trajectory: Trajectory) -> float:
    """The temperature a trajectory's logprobs were recorded at: its sampling temperature, or 1 for
    greedy decoding (backends record greedy tokens' logprobs under the plain softmax)."""
    temperature = float(trajectory.sampling.get("temperature", 1.0) or 0.0)
    return temperature if temperature > 0 else 1.0


def sampled_distribution(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """[N, V] log softmax(logits / T) in fp32: the distribution each of N positions' tokens were
    sampled from, ``temperature`` [N] (None: T = 1). ``policy_logprobs`` and the local teacher pick
    the positions they score first, so no [B, L, V] tensor goes through it."""
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature.to(logits.device)[:, None]
    return torch.log_softmax(logits, dim=-1)


def _output_layer(model) -> torch.nn.Module | None:
    """The policy's output layer (a Hugging Face causal LM's ``get_output_embeddings()``, through a
    DDP wrapper or a PEFT model), or None when it names none."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return inner.get_output_embeddings()


def position_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                    columns: torch.Tensor) -> torch.Tensor:
    """[N, V] ``model``'s logits at the N positions ``(rows[i], columns[i])`` of ``input_ids`` [B, L],
    with gradients if enabled: only those positions go through the output layer.

    The model runs as called (its own forward, so DDP's and FSDP's hooks run as always) with
    ``logits_to_keep`` set to the columns some position needs; a forward pre-hook on the output
    layer then hands it just the N positions' hidden states, not the kept columns of every row
    ([B, C, V] logits, mostly positions nobody reads: a row's neighbours' responses sit at other
    columns). A model whose forward does not call its output layer module gets its [B, C, V] logits
    picked after the fact: the same values, at the old cost."""
    cols, kept = torch.unique(columns, return_inverse=True)  # [C] sorted kept columns; each position's index in them
    device = input_ids.device
    cols, rows, kept = cols.to(device), rows.to(device), kept.to(device)
    head = _output_layer(model)
    picked = []

    def pick(module, args):  # the output layer's input: [B, C, H] -> [N, H]
        picked.append(True)
        return (args[0][rows, kept], *args[1:])

    handle = head.register_forward_pre_hook(pick) if head is not None else None
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=cols,
                       use_cache=False).logits  # no KV cache: nothing generates after it
    finally:
        if handle is not None:
            handle.remove()
    if not picked:
        return logits[rows, kept]  # [B, C, V] -> [N, V]
    if logits.shape[:-1] != rows.shape:
        raise ModelError(f"{type(model).__name__}'s forward reshaped its output layer's logits to "
                         f"{tuple(logits.shape)}; agentkit scores a model whose logits are its output layer's "
                         "output (a Hugging Face causal LM).")
    return logits


def policy_logprobs(model, batch: TokenBatch, *, support: bool = False):
    """[B, L] log pi(target | prefix) under ``model`` (with gradients if enabled), at each row's
    sampling temperature (``batch.temperature``: log softmax(logits / T), as TRL and verl compute
    it, so before the first update the ratio to the recorded logprobs is 1); 0 outside
    ``response_mask``.

    With ``support``, also the policy's logprobs over the teacher's support at the response
    positions: [N, K] (N = the positions where ``response_mask > 0``, in row-major order, i.e. the
    rows of ``x[response_mask > 0]``) at ``batch.teacher_support_ids``, or [N, V] (the whole
    vocabulary) when those are None. A [B, L, V] tensor is never built for it.

    Only the response positions go through the output layer and the softmax (``position_logits``):
    prompts are most of a row, and in chat mode each row's turns sit at other columns than its
    neighbours', so the [B, L, V] logits would be mostly positions no objective reads (with a
    151k-token vocabulary the largest tensors of a step). Values outside ``response_mask`` are 0;
    every objective reads these values under the response mask.
    """
    B, L = batch.response_mask.shape
    device = batch.input_ids.device
    rows, columns = (batch.response_mask.to(device) > 0).nonzero(as_tuple=True)  # [N] row-major
    logits = position_logits(model, batch.input_ids, batch.attention_mask, rows, columns)  # [N, V]
    device = logits.device
    rows, columns = rows.to(device), columns.to(device)
    temperature = None if batch.temperature is None else batch.temperature.to(device)[rows]
    logp = sampled_distribution(logits, temperature)  # [N, V]
    targets = batch.input_ids.to(device)[rows, columns + 1]  # [N]: the token each position predicts
    sampled = torch.zeros((B, L), dtype=logp.dtype, device=device).index_put(
        (rows, columns), logp.gather(1, targets[:, None]).squeeze(1))  # [B, L]
    if not support:
        return sampled
    if batch.teacher_support_ids is None:
        return sampled, logp
    return sampled, logp.gather(1, batch.teacher_support_ids.to(device)[rows, columns])  # [N, K]
