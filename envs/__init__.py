"""Turn-based text environments: the protocol, the registry, shared wrappers, the checker."""

from agentkit.envs.checker import check_env, play_expert
from agentkit.envs.formats import ACTION_TAG, SEARCH_ANSWER, ActionFormat
from agentkit.envs.protocol import INFO_KEYS, Env
from agentkit.envs.registry import REGISTRY, EnvInfo, EnvSpec, env_info, make, register, status
from agentkit.envs.wrappers import ActionParser, CleanObservation, ParseAction, TurnLimit, Wrapper, clean_text

__all__ = [
    "INFO_KEYS", "Env", "REGISTRY", "EnvInfo", "EnvSpec", "env_info", "make", "register", "status", "check_env",
    "play_expert", "ActionFormat", "ACTION_TAG", "SEARCH_ANSWER", "ActionParser", "CleanObservation", "ParseAction",
    "TurnLimit", "Wrapper", "clean_text",
]
