"""Several training processes: ``torchrun`` or ``accelerate launch`` start ``agentkit train`` once per rank.

The loop in ``agentkit.train`` is written once. It asks a ``Ranks`` object (``ranks()`` below)
for everything that differs between one process and several: ``SingleProcess`` hands the loop its
own objects back and changes nothing (accelerate is not even imported); ``Accelerated`` wraps an
``accelerate.Accelerator`` (``cpu=True`` when there is no CUDA: gloo), so DDP or FSDP2 come from the
launcher's configuration, and splits the work of a step so the ranks together do what one process
would:

* Rollouts: task i of a step is played by rank i % world (a GRPO group never straddles ranks),
  each episode with its own sampling seeds, so an episode is the same whichever rank plays it.
  Then every rank receives every trajectory, so the step batch, the objective's ``prepare``
  (teacher and reference scores included) and the skill bank's statistics are the same on all.
* Updates: each rank runs the loss on its share of every minibatch's episodes, normalized by the
  *whole* minibatch (``with_normalizers`` before splitting), so the ranks' gradients sum to the
  one-process gradient. DDP and FSDP *average* gradients over ranks, so each rank's loss is
  multiplied by the world size before backward. Each rank synchronizes gradients once per
  optimizer step (its other backwards under ``no_sync``); a rank with too few micro-batches runs
  zero-weighted passes. Metrics are weighted by token share, then summed over ranks.
* Evaluation, metrics files, checkpoints, plots and the skill bank file: the main process, while
  the others wait. Checkpoints hold whole weights and the whole optimizer state, as one process
  writes them, so either can resume the other's run.

Under FSDP no rank holds the whole model, so each keeps a frozen whole copy for sampling,
evaluation and saving, refreshed after every step (the "sync weights" of the loop), and the
optimizer state is gathered for a checkpoint. FSDP1 and DeepSpeed are refused: DeepSpeed's engine
owns accumulation (a fixed number of micro-batches per step), clipping and the optimizer step,
while here ranks run different numbers of micro-batches and the loop skips a non-finite step.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

import torch

from agentkit.core.errors import AgentkitError, ConfigError
from agentkit.core.trajectory import Trajectory
from agentkit.objectives.batch import TokenBatch
from agentkit.rollout.collector import RolloutStats

T = TypeVar("T")


def world_size() -> int:
    """Processes in this run, as the launcher set ``WORLD_SIZE`` (1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed() -> bool:
    return world_size() > 1


def batch_to(batch: TokenBatch, device: torch.device) -> TokenBatch:
    """``batch`` with its tensors on ``device`` (itself on the CPU)."""
    if device.type == "cpu":
        return batch
    return replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in fields(batch)
                             if isinstance(getattr(batch, f.name), torch.Tensor)})


class SingleProcess:
    """One process, on the GPU when there is one (else the CPU): every method returns what the loop
    would have used anyway."""

    rank, world, is_main = 0, 1, True

    def __init__(self) -> None:
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def on_main(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def prepare(self, policy, optimizer):
        """(module to train, optimizer to step, module with the full weights for sampling and saving)."""
        return policy, optimizer, policy

    def shard(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def gather(self, trajectories: list[Trajectory], stats: RolloutStats) -> tuple[list[Trajectory], RolloutStats]:
        return trajectories, stats

    def to_device(self, batch: TokenBatch) -> TokenBatch:
        return batch_to(batch, self.device)

    def micro_batches(self, model, minibatch: TokenBatch, max_tokens: int) -> Iterator[TokenBatch]:
        for micro in minibatch.micro_batches(max_tokens):
            yield self.to_device(micro)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm_(self, model, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    def sum(self, value: float) -> float:
        return value

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def sync_weights(self, model, sampler) -> None:
        pass

    def optimizer_state(self, model, optimizer) -> dict | None:
        return None

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


class Accelerated:
    """Several processes under ``torchrun`` or ``accelerate launch`` (see the module docstring)."""

    def __init__(self) -> None:
        try:
            from accelerate import Accelerator, DistributedType
            from accelerate.utils import DistributedDataParallelKwargs
        except ImportError as err:
            raise ConfigError(f"WORLD_SIZE={world_size()}: training with several processes needs accelerate; "
                              "pip install 'agentkit[distributed]'.") from err
        cpu = not torch.cuda.is_available()
        if cpu and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            warnings.warn("accelerate shards with FSDP on GPUs only; on CPU every rank keeps the whole model (DDP).",
                          stacklevel=2)
        # Buffers (rotary frequencies) are the same on every rank. Broadcasting them at each forward
        # is a collective, and ranks run different numbers of forwards per step.
        self.accelerator = Accelerator(cpu=cpu, kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
        kind = self.accelerator.distributed_type
        if kind == DistributedType.DEEPSPEED:
            raise ConfigError("agentkit train does not support DeepSpeed: its engine owns accumulation, clipping and the "
                              "optimizer step, and ranks here run different numbers of micro-batches. Use DDP, or FSDP "
                              "with fsdp_version: 2.")
        if kind == DistributedType.FSDP and not self.accelerator.is_fsdp2:
            raise ConfigError("agentkit train supports FSDP2 only: set fsdp_version: 2 in the accelerate config "
                              "(or --fsdp_version 2).")
        if self.accelerator.gradient_accumulation_steps != 1:
            raise ConfigError(f"accelerate's gradient_accumulation_steps is {self.accelerator.gradient_accumulation_steps}; "
                              "agentkit train accumulates each minibatch itself (train.micro_batch_tokens): set it to 1.")
        self.sharded = kind == DistributedType.FSDP  # no rank holds the whole model
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.device = self.accelerator.device
        self._names: list[str] = []

    # -- setup ----------------------------------------------------------------------------------------
    def on_main(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the main process; every rank gets its result, or raises its error."""
        import torch.distributed as dist

        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn(*args))
            except AgentkitError as err:
                box[0] = ("error", err)
        dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise value
        return value

    def prepare(self, policy, optimizer):
        """Wrap for DDP or FSDP. The optimizer keeps the state it has (a resumed run's)."""
        # the optimizer's parameter order (the trained ones: a LoRA policy's adapter), to name its state under FSDP
        self._names = [name for name, p in policy.named_parameters() if p.requires_grad]
        if not self.sharded:
            with warnings.catch_warnings():  # newer torch renames it; broadcast_buffers=False still means it
                warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
                model, optimizer = self.accelerator.prepare(policy, optimizer)
            return model, optimizer, self.accelerator.unwrap_model(model)
        if len(self._names) < sum(1 for _ in policy.parameters()):
            raise ConfigError("train.lora with FSDP: accelerate's FSDP2 preparation leaves the adapter frozen with "
                              "the base, so nothing would train. Train a LoRA adapter with DDP (launch without the "
                              "FSDP config: only the adapter's gradients are reduced), or set train.lora.rank=0.")
        # FSDP: sampling and saving need whole weights: a frozen copy, synced after every step
        sampler = copy.deepcopy(policy).requires_grad_(False).to(self.device)
        # a resumed run's optimizer state is keyed by parameters that prepare replaces (by sharded ones)
        resumed = optimizer.state_dict() if optimizer.state else None
        optimizer.state.clear()
        model, optimizer = self.accelerator.prepare(policy, optimizer)
        if resumed is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            named = {"state": {self._names[i]: values for i, values in resumed["state"].items()},
                     "param_groups": [{**group, "params": [self._names[i] for i in group["params"]]}
                                      for group in resumed["param_groups"]]}
            set_optimizer_state_dict(model, _inner(optimizer), named, options=StateDictOptions(full_state_dict=True))
        return model, optimizer, sampler

    # -- rollouts -------------------------------------------------------------------------------------
    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's items: i % world == rank."""
        return list(items[self.rank :: self.world])

    def gather(self, trajectories: list[Trajectory], stats: RolloutStats) -> tuple[list[Trajectory], RolloutStats]:
        """Every rank's trajectories, on every rank; the statistics of them all."""
        import torch.distributed as dist

        shards: list[Any] = [None] * self.world
        dist.all_gather_object(shards, (trajectories, stats.wall_s))
        merged = RolloutStats(wall_s=max(wall for _, wall in shards))
        everything = [t for played, _ in shards for t in played]
        for t in everything:
            merged.add(t)
        return everything, merged

    # -- updates --------------------------------------------------------------------------------------
    def to_device(self, batch: TokenBatch) -> TokenBatch:
        return batch_to(batch, self.device)

    def micro_batches(self, model, minibatch: TokenBatch, max_tokens: int) -> Iterator[TokenBatch]:
        """This rank's micro-batches of ``minibatch`` (call ``with_normalizers`` on the whole of it
        first). The loop body runs inside the right gradient-sync context: every backward but the
        rank's last one accumulates locally (``no_sync``), so each rank synchronizes gradients
        exactly once per optimizer step. A rank with fewer micro-batches than it must run (none,
        under DDP; fewer than the busiest rank, under FSDP, whose forwards gather parameters) runs
        zero-weighted passes instead."""
        episodes = torch.unique(minibatch.episode_index).tolist()
        mine = set(episodes[self.rank :: self.world])
        rows = [r for r in range(minibatch.num_rows) if int(minibatch.episode_index[r]) in mine]
        micros = minibatch.rows(rows).micro_batches(max_tokens) if rows else []
        passes = self._max(len(micros)) if self.sharded else max(1, len(micros))
        for i in range(passes):
            last = i == passes - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(model):
                if i < len(micros):
                    yield self.to_device(micros[i])
                else:
                    self._idle_pass(model, minibatch)

    def _idle_pass(self, model, minibatch: TokenBatch) -> None:
        """A forward and backward with zero weight: every parameter gets a zero gradient, and this
        rank takes part in the collectives of a pass."""
        from agentkit.objectives import policy_logprobs

        probe = self.to_device(minibatch.rows([0]))
        self.accelerator.backward(policy_logprobs(model, probe).sum() * 0.0)

    def backward(self, loss: torch.Tensor) -> None:
        # Each rank's loss is its share of the minibatch's loss (whole-minibatch normalizers), so
        # the one-process gradient is the *sum* of the ranks' gradients; DDP and FSDP average them.
        self.accelerator.backward(loss * self.world)

    def clip_grad_norm_(self, model, max_norm: float) -> float:
        return float(self.accelerator.clip_grad_norm_(model.parameters(), max_norm))

    def _max(self, value: int) -> int:
        tensor = torch.tensor(value, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return int(tensor.item())

    def sum(self, value: float) -> float:
        tensor = torch.tensor(value, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-key sums over ranks (a rank with no rows may lack keys)."""
        import torch.distributed as dist

        shards: list[Any] = [None] * self.world
        dist.all_gather_object(shards, metrics)
        total: dict[str, float] = {}
        for shard in shards:
            for key, value in shard.items():
                total[key] = total.get(key, 0.0) + value
        return total

    # -- after the updates ----------------------------------------------------------------------------
    def sync_weights(self, model, sampler) -> None:
        """Under FSDP, copy the updated (sharded) weights into every rank's sampling copy."""
        if not self.sharded:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        sampler.load_state_dict(whole)

    def optimizer_state(self, model, optimizer) -> dict | None:
        """Under FSDP, the whole optimizer state in ``torch.optim`` form (parameter indices), on
        the main process; None where the optimizer already holds it all. Call on every rank."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        named = get_optimizer_state_dict(model, _inner(optimizer),
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:
            return None
        index = {name: i for i, name in enumerate(self._names)}
        return {"state": {index[name]: values for name, values in named["state"].items()},
                "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                                 for group in named["param_groups"]]}

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def close(self) -> None:
        self.accelerator.end_training()


def _inner(optimizer):
    """The ``torch.optim`` optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


Ranks = SingleProcess | Accelerated


def ranks() -> Ranks:
    """``Accelerated`` when a launcher started several processes (``WORLD_SIZE`` > 1), else ``SingleProcess``."""
    return Accelerated() if is_distributed() else SingleProcess()
