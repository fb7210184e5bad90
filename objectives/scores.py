"""The loop's no-gradient signals an objective reads (``StepScores``: teacher scores and turn
judgments). The types live in ``agentkit.core.scores``, below both objectives and teachers."""

from agentkit.core.scores import LABELS, Judgments, StepScores, TeacherScores

__all__ = ["LABELS", "Judgments", "StepScores", "TeacherScores"]
