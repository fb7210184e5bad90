"""What a teacher returns: ``TeacherScores``, defined with the objectives that read it
(``agentkit.objectives.scores``) so that objectives never import a teacher."""

from __future__ import annotations

from agentkit.objectives.scores import TeacherScores

__all__ = ["TeacherScores"]
