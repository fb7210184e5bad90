"""agentkit: train LLM agents on multi-turn text environments."""

__version__ = "0.1.0"
