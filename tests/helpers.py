"""Helpers several test modules share (fixtures live in conftest.py). Test modules import these
from here, never from each other.

Ray actors cannot import a test module: tests that run ``FaultyEnv`` in actors register this module
with ``ray.cloudpickle.register_pickle_by_value(helpers)``.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from agentkit.envs.wrappers import TurnLimit
from agentkit.objectives import TokenBatch

# -- environment workers (test_workers, test_ray) -------------------------------------------------
INFO = {"task": "wait", "admissible_actions": None, "action_valid": True, "won": False, "score": 0.0, "privileged": None}


class FaultyEnv:
    """Injects faults real environments cannot produce on demand: on step ``at`` it hangs, kills
    its own process, or raises, depending on ``fault``."""

    def __init__(self, fault: str = "none", at: int = 2) -> None:
        self.fault, self.at, self.steps = fault, at, 0

    def reset(self, *, seed=None, options=None):
        self.steps = 0
        return f"room {seed}", dict(INFO)

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            if self.fault == "hang":
                time.sleep(3600)
            elif self.fault == "die":
                os._exit(3)
            elif self.fault == "raise":
                raise ValueError("broken simulator")
        return f"step {self.steps}", 0.0, False, False, dict(INFO)

    def close(self):
        pass


def faulty(fault: str, max_turns: int = 4):
    return TurnLimit(FaultyEnv(fault), max_turns)


class SlowToStart:
    """A picklable environment maker whose unpickling (in a fresh worker process, before its first
    message) takes ``seconds``: a worker starting slowly, as one does on a busy machine."""

    def __init__(self, seconds: float, fault: str = "raise") -> None:
        self.seconds, self.fault = seconds, fault

    def __getstate__(self):
        return {"seconds": self.seconds, "fault": self.fault}

    def __setstate__(self, state):
        time.sleep(state["seconds"])
        self.seconds, self.fault = state["seconds"], state["fault"]

    def __call__(self):
        return faulty(self.fault)


class CountingResets:
    """A real environment (vaults) whose observation after a reset says how many resets this
    instance has run: a reset run twice shows."""

    def __init__(self) -> None:
        from agentkit.envs import ActionParser, make

        self.env = make("vaults/vaults-v0", max_turns=3, action_parser=ActionParser(require_match=False))
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        obs, info = self.env.reset(seed=seed)
        return f"{obs} [reset {self.resets}]", info

    def step(self, action):
        return self.env.step(action)

    def close(self):
        self.env.close()


def drain(pool, count, timeout=60.0):
    results, deadline = [], time.time() + timeout
    while len(results) < count and time.time() < deadline:
        results += pool.poll(timeout=1.0)
    assert len(results) == count, results
    return sorted(results, key=lambda r: r.slot)


class KillingBackend:
    """Wraps a backend; SIGKILLs the first process that ``pids()`` lists during the third generate
    call (a real crash, mid-rollout). ``killed`` holds the pid it killed."""

    def __init__(self, inner, pids, at_call: int = 3):
        self.inner, self.pids, self.at_call, self.calls, self.killed = inner, pids, at_call, 0, []
        self.tokenizer, self.name, self.max_context = inner.tokenizer, inner.name, inner.max_context

    def generate(self, prompts, params, seeds=None):
        self.calls += 1
        if self.calls == self.at_call and not self.killed:
            self.killed.append(self.pids()[0])
            os.kill(self.killed[0], signal.SIGKILL)
        return self.inner.generate(prompts, params, seeds)


# -- objectives (test_objectives, test_distill_objectives) ----------------------------------------
def batch_of(response_mask, old, adv, episodes=None, ref=None) -> TokenBatch:
    mask = torch.tensor(response_mask, dtype=torch.float32)
    rows, length = mask.shape
    return TokenBatch(
        input_ids=torch.zeros((rows, length + 1), dtype=torch.long), attention_mask=torch.ones((rows, length + 1), dtype=torch.long),
        response_mask=mask, old_logprobs=torch.tensor(old), advantages=torch.tensor(adv), weights=mask.clone(),
        episode_index=torch.tensor(episodes if episodes is not None else list(range(rows))),
        turn_index=torch.zeros((rows, length), dtype=torch.long), ref_logprobs=None if ref is None else torch.tensor(ref),
    ).with_normalizers()
