"""The update phase of the training loop: minibatch optimizer steps over a step's token batch, with a
token budget per micro-batch, NaN/inf updates skipped. The loop (``agentkit.train``) and the default
teacher's fine-tuning (``agentkit.train.default_teacher``) both run it; ``benchmarks/train_step.py`` times it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from agentkit.core.faults import fault_active, fault_point
from agentkit.objectives import policy_logprobs
from agentkit.train.config import TrainSection


@dataclass
class UpdateStats:
    """What the updates of one step did."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    objective_metrics: dict[str, float] = field(default_factory=dict)
    skipped: int = 0  # updates whose loss or gradient was NaN/inf (never applied)
    bad_streak: int = 0  # such updates in a row, carried across steps


def step_lr(train: TrainSection, step: int) -> float:
    """The lr of training step ``step`` (from 0): linear warmup over ``train.warmup_steps``, then ``train.lr``."""
    return train.lr * min(1.0, (step + 1) / train.warmup_steps) if train.warmup_steps else train.lr


def update(model, optimizer, objective, batch, *, train: TrainSection, ranks, rng: random.Random,
           needs_support: bool, bad_streak: int = 0, step: int = 0) -> UpdateStats:
    """``train.epochs`` passes of ``train.minibatches`` optimizer steps over ``batch`` (split by
    episode), micro-batches of ``train.micro_batch_tokens`` padded tokens. A NaN/inf loss or
    gradient skips its update. ``benchmarks/train_step.py`` times this very function."""
    stats = UpdateStats(bad_streak=bad_streak)
    for group in optimizer.param_groups:
        group["lr"] = step_lr(train, step)
    # tests: a NaN loss, or a finite loss with an overflowed gradient, as a diverging run gets
    nan_fault, inf_grad_fault = fault_active("loss.nan", step + 1), fault_active("grad.inf", step + 1)
    episodes = torch.unique(batch.episode_index).tolist()
    for _ in range(train.epochs):
        order = episodes[:]
        rng.shuffle(order)
        for chunk in range(train.minibatches):
            chosen = set(order[chunk::train.minibatches])
            rows = [r for r in range(batch.num_rows) if int(batch.episode_index[r]) in chosen]
            minibatch = batch.rows(rows).with_normalizers()
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in ranks.micro_batches(model, minibatch, train.micro_batch_tokens):  # this rank's share
                if needs_support:
                    logprobs, support = policy_logprobs(model, micro, support=True)
                    loss, metrics = objective.loss(micro, logprobs, support)
                else:
                    loss, metrics = objective.loss(micro, policy_logprobs(model, micro))
                if nan_fault:
                    loss = loss * float("nan")
                ranks.backward(loss)
                total += float(loss.detach())
                share = micro.num_response_tokens / max(1, minibatch.num_response_tokens)
                for key, value in metrics.items():
                    stats.objective_metrics[key] = stats.objective_metrics.get(key, 0.0) + share * value
            if inf_grad_fault:
                next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
            total = ranks.sum(total)
            norm = ranks.clip_grad_norm_(model, train.grad_clip if train.grad_clip > 0 else float("inf"))
            if not (math.isfinite(norm) and math.isfinite(total)):
                stats.skipped += 1  # a NaN/inf loss or gradient never reaches the weights
                stats.bad_streak += 1
                optimizer.zero_grad(set_to_none=True)
                continue
            stats.bad_streak = 0
            fault_point("update", step + 1)  # tests: killed between a backward and its optimizer step
            optimizer.step()
            stats.losses.append(total)
            stats.grad_norms.append(norm)
    updates = max(1, train.epochs * train.minibatches)
    stats.objective_metrics = {k: v / updates for k, v in ranks.sum_metrics(stats.objective_metrics).items()}
    return stats
