"""Turn-based text environments: the protocol, the registry, shared wrappers, the checker."""

from agentkit.envs.checker import check_env, play_expert
from agentkit.envs.protocol import INFO_KEYS, Env
from agentkit.envs.registry import REGISTRY, make, register, status
from agentkit.envs.wrappers import ActionParser, CleanObservation, ParseAction, TurnLimit, Wrapper, clean_text

__all__ = [
    "INFO_KEYS", "Env", "REGISTRY", "make", "register", "status", "check_env", "play_expert",
    "ActionParser", "CleanObservation", "ParseAction", "TurnLimit", "Wrapper", "clean_text",
]
