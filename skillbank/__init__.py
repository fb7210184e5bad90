"""agentkit.skillbank: filled in by later issues."""
