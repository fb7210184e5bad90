"""A third-party environment for agentkit, registered by entry point only."""
