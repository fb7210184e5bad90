"""Generation backends, token-exact context assembly and the episode collector."""

from agentkit.rollout.backend import Generation, GenerationBackend, SamplingParams
from agentkit.rollout.collector import Collector, EpisodeSpec, RolloutStats
from agentkit.rollout.context import ChatContext, WindowContext

__all__ = [
    "Generation", "GenerationBackend", "SamplingParams", "Collector", "EpisodeSpec", "RolloutStats",
    "ChatContext", "WindowContext",
]
