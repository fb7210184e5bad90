"""What a teacher returns: ``TeacherScores``, defined with the objectives that read it
(``agentkit.core.scores``) so that objectives never import a teacher."""

from __future__ import annotations

from agentkit.core.scores import TeacherScores

__all__ = ["TeacherScores"]
