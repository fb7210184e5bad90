"""The same lock, registered with an ``EnvSpec``: its own answer format, turn limit, splits and
description (the entry point ``demo/lock-brackets-v0`` names ``SPEC``)."""

from __future__ import annotations

from agentkit.envs import ActionFormat, ActionParser, EnvSpec

from agentkit_plugin_demo.lock import CombinationLock

BRACKETS = ActionFormat(
    instruction="You open combination locks. Answer with one command in square brackets, for example [turn red].",
    stop=("]",),
    parser=ActionParser(pattern=r"\[([^\[\]]*)\]"),
    template="[{action}]",
    invalid_feedback="Write one command in square brackets, for example [turn red].",
)

SPEC = EnvSpec(
    CombinationLock, {"length": 3}, max_turns=6, splits=("train", "eval"), action_format=BRACKETS,
    description="A combination lock; answers in [brackets] (length)",
)
