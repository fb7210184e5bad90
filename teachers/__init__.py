"""agentkit.teachers: filled in by later issues."""
