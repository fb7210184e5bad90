"""agentkit.objectives: filled in by later issues."""
