"""The teacher protocol: what ``make_teacher`` checks a teacher plugin's result against.

A teacher plugin (entry-point group ``agentkit.teachers``) is a factory
``(arg, *, policy, tokenizer, bank, privileged) -> Teacher``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentkit.rollout.backend import GenerationBackend

from agentkit.core.scores import TeacherScores
from agentkit.core.trajectory import Trajectory

if TYPE_CHECKING:  # the batch layout objectives build; teachers only read its tensors
    from agentkit.objectives.batch import TokenBatch

MEMBERS = ("name", "tokenizer", "full_vocabulary", "score", "generation_backend")


@runtime_checkable
class Teacher(Protocol):
    """Scores the student's own tokens, without gradients.

    Attributes:
        name: for messages and metrics (``self``, ``model:DIR``, ...).
        tokenizer: the tokenizer whose ids the teacher scores; the student's ids, so the two must
            agree (``check_same_tokenizer``).
        full_vocabulary: ``score(..., topk=0)`` gives the whole vocabulary's logprobs (a local model);
            False: only the top k (a server's ``prompt_logprobs``), so an objective that needs the
            whole distribution (OPD's exact estimator, topk 0) is refused when the run is set up.
    """

    name: str
    tokenizer: Any
    full_vocabulary: bool

    def score(self, batch: TokenBatch, trajectories: Sequence[Trajectory], *,
              topk: int | None = None) -> TeacherScores:
        """Teacher log-probs at ``batch``'s response positions (``batch`` is
        ``build_batch(trajectories)``).

        ``topk``: None = no distribution; 0 = the full vocabulary; k > 0 = the teacher's top k.
        """
        ...

    def generation_backend(self) -> GenerationBackend | None:
        """A greedy generation backend over the teacher's weights (the ``teacher`` turn judge
        asks it), or None when this teacher cannot generate."""
        ...
