"""Turn-based text environments: the protocol, the registry, shared wrappers, the checker, and
Gymnasium both ways (``gymnasium.make("agentkit/...")``, ``gymnasium/<Gymnasium id>``: envs/gym.py)."""

from agentkit.envs.checker import check_env, play_expert
from agentkit.envs.formats import ACTION_TAG, BRACKET_ACTION_TAG, SEARCH_ANSWER, ActionFormat
from agentkit.envs.gym import AnyText, FromGymnasium, TextEnv, gymnasium_id
from agentkit.envs.gym_registration import register_gymnasium
from agentkit.envs.protocol import INFO_KEYS, Env
from agentkit.envs.registry import REGISTRY, EnvInfo, EnvSpec, env_info, make, register, status
from agentkit.envs.wrappers import ActionParser, CleanObservation, ParseAction, TurnLimit, Wrapper, clean_text

__all__ = [
    "INFO_KEYS", "Env", "REGISTRY", "EnvInfo", "EnvSpec", "env_info", "make", "register", "status", "check_env",
    "play_expert", "ActionFormat", "ACTION_TAG", "BRACKET_ACTION_TAG", "SEARCH_ANSWER", "ActionParser", "CleanObservation", "ParseAction",
    "TurnLimit", "Wrapper", "clean_text", "TextEnv", "AnyText", "FromGymnasium", "gymnasium_id", "register_gymnasium",
]
