"""How a model writes its action: the environment's action format.

An ``ActionFormat`` belongs to the environment's registration (``agentkit.envs.env_info(id)``) and
is the one place that says, for that environment, what the system prompt asks for, where
generation stops, how the response becomes an action, and how an expert's action is written as a
response in demonstrations. The collector, the demonstrations and ``make(..., action_parser=
"format")`` all read it, so the prompt, the stop strings and the parser cannot disagree.

Three formats are built in: ``ACTION_TAG`` (one command inside ``<action></action>``, the default for
every environment that does not declare one), ``BRACKET_ACTION_TAG`` (the same tags around a move in
TextArena's square brackets, ``<action>[A C]</action>``) and ``SEARCH_ANSWER`` (Search-R1's ``<search>`` /
``<answer>``, which the Search-QA environment parses itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentkit.envs.wrappers import INVALID_FORMAT_FEEDBACK, ActionParser

from agentkit.core.errors import ConfigError

ACTION_PLACEHOLDER = "{action}"


@dataclass(frozen=True)
class ActionFormat:
    """The environment's answer format.

    Attributes:
        instruction: the system prompt that tells the model how to answer.
        stop: generation stops once the response contains any of these (the stop string is kept).
        parser: turns the model's response into the environment's action (``ParseAction``); None
            when the environment reads the whole response itself.
        template: an expert action written as a model response, ``{action}`` standing for the
            action (demonstrations); ``"{action}"`` when expert actions are already responses.
        invalid_feedback: the observation after a response the parser finds no action in.
    """

    instruction: str
    stop: tuple[str, ...] = ()
    parser: ActionParser | None = None
    template: str = ACTION_PLACEHOLDER
    invalid_feedback: str = INVALID_FORMAT_FEEDBACK

    def __post_init__(self) -> None:
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ConfigError("ActionFormat.instruction must be the system prompt text (a non-empty string).")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"ActionFormat.stop must be a tuple of non-empty strings, e.g. ('</action>',); got {self.stop!r}.")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.parser is not None and not isinstance(self.parser, ActionParser):
            raise ConfigError(f"ActionFormat.parser must be an agentkit.envs.ActionParser or None, got {self.parser!r}.")
        if ACTION_PLACEHOLDER not in self.template:
            raise ConfigError(f"ActionFormat.template must contain {ACTION_PLACEHOLDER!r} (where the action goes), "
                              f"got {self.template!r}.")

    def render(self, action: str) -> str:
        """An expert action written as the model should write it."""
        return self.template.replace(ACTION_PLACEHOLDER, action)


ACTION_TAG = ActionFormat(
    instruction=(
        "You are an agent in a text environment. Read the observation, then answer with exactly one "
        "command inside <action></action> tags, for example <action>go north</action>."
    ),
    stop=("</action>",),
    parser=ActionParser(),
    template="<action>{action}</action>",
)

# TextArena's games read the move written in square brackets and say so in their rules ("e.g., '[A C]'"),
# so the instruction asks for the brackets inside the tags; the tag content goes to the game (which brackets a bare move)
BRACKET_ACTION_TAG = ActionFormat(
    instruction=(
        "You are playing a text game. Read the observation, then answer with exactly one move inside "
        "<action></action> tags, written in square brackets as the game asks, for example <action>[A C]</action> "
        "or <action>[42]</action>."
    ),
    stop=("</action>",),
    parser=ActionParser(),
    template="<action>{action}</action>",
    invalid_feedback="Invalid action: no action found. Answer with <action>[your move]</action>.",
)

SEARCH_ANSWER = ActionFormat(
    instruction=(
        "You answer questions by searching a text corpus. You may reason first. To search, write one query "
        "between <search> and </search>; the top passages come back between <information> and </information>. "
        "When you know the answer, write it between <answer> and </answer>, a few words with no explanation, "
        "for example <answer>Paris</answer>."
    ),
    stop=("</search>", "</answer>"),
    parser=None,  # the environment reads the last complete <search> or <answer> of the whole response
    invalid_feedback="Invalid action: write <search>your query</search> or <answer>your answer</answer>.",
)
