"""TextArena's single-player games as agentkit environments (``textarena/<TextArena id>``).

The adapter plays the game's raw version (``textarena.make("<id>-raw")``, no TextArena wrappers)
and does itself what agentkit's contract asks, from what TextArena 0.7.4 does:

- Observations. ``get_observation()`` hands over the messages the game added since the player last
  looked (rules, board, hints). Their texts are joined; the game's echo of the player's own action
  is dropped; when the game ends, its reason (which TextArena keeps in ``game_info`` only) is added.
  ``info['task']`` is the rules text (the game's prompt), which the first observation also holds.
- Actions. The model writes one move in TextArena's square brackets inside the action tags,
  ``<action>[A C]</action>`` (``BRACKET_ACTION_TAG``); the tag content goes to the game as written.
  A move without brackets gets them, as TextArena's own ``ActionFormattingWrapper`` does.
- Invalid moves. TextArena sets ``made_invalid_move`` and clears it again before ``step()``
  returns, so the adapter reads what is left: the error count (a valid move resets it to 0) and
  ``game_info[0]['invalid_move']``, set when the second invalid move in a row ends the game, lost
  (TextArena allows one: the first gets a warning and the move again).
- Rewards. TextArena pays once, when the game ends (``close()`` returns it): 1 for a win, else the
  game's partial credit (GuessTheNumber ``1 - distance / range`` of the last guess, even after a
  loss by invalid moves; TowerOfHanoi the share of disks in place on C). That is ``score``; each
  step's reward is the change of the score, so 0 until the last step. ``won``: the final reward is
  at least 1 (the single-player games' ``set_outcome(reward=1)`` on success).
- Seeds. ``reset(seed=s)`` plays TextArena seed ``split offset + s``: ``train`` and ``eval`` are
  disjoint seed ranges. Games with few distinct tasks repeat them across seeds and splits:
  GuessTheNumber draws its secret from 1-20, and TowerOfHanoi has no randomness (every seed is the
  same puzzle, so its registration has the one split ``train``). TextArena seeds Python's global
  ``random`` at every reset, and some games draw from it while playing; the adapter swaps its own
  generator state in around each reset and step, so an episode depends on its seed only and the
  caller's ``random`` is left as it was.
- Experts. ``EXPERTS`` holds, per game (TextArena's entry point, so every variant of the game),
  the legal moves, a winning plan from the current state and the privileged text: GuessTheNumber
  plays a binary search (its privileged text names the secret), TowerOfHanoi the fewest moves from
  any position. Other games play without them: ``admissible_actions`` and ``privileged`` are None
  and ``info`` has no ``expert_plan``.
- Other games. ``game_spec("Sudoku-v0")`` is the ``EnvSpec`` of any TextArena game (the bracket
  format, TextArena's turn limit), for ``register`` or an ``agentkit.envs`` entry point; without one,
  ``--env agentkit.envs.textarena_env:TextArenaEnv --env-kwargs game=Sudoku-v0`` plays it in the
  default ``<action>`` format.

Kept as TextArena has them: TowerOfHanoi plays every bracketed move of one action (``[A C] [A B]``
is two moves in one turn), and TextArena's turn limits let one valid move more than ``max_turns``
through (GuessTheNumber-v0 ends after the 11th guess).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import textarena as ta
from agentkit.envs.formats import BRACKET_ACTION_TAG
from agentkit.envs.gym import TextEnv
from agentkit.envs.protocol import task_index
from agentkit.envs.spec import DEFAULT_MAX_TURNS, EnvSpec
from agentkit.envs.wrappers import clean_text
from textarena.envs.registration import ENV_REGISTRY
from textarena.wrappers import ActionFormattingWrapper

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError, did_you_mean

SEEDS_PER_SPLIT = 1_000_000
SPLIT_OFFSETS = {"train": 0, "eval": SEEDS_PER_SPLIT}
_RAW = "-raw"  # TextArena registers every game again without its wrappers under "<id>-raw"
_NLTK_RESOURCE = re.compile(r"Resource '?([\w/.-]+?)'? not found")


# -- what the adapter knows of particular games ------------------------------------------------------
@dataclass(frozen=True)
class GameExpert:
    """What TextArena's API does not tell about one game. Each function reads the raw TextArena env.

    Attributes:
        admissible: the legal moves in the current state, as the model writes them (``[A C]``).
        plan: moves that win from the current state.
        privileged: the text a teacher may see, given the plan.
    """

    admissible: Callable[[Any], list[str]]
    plan: Callable[[Any], list[str]]
    privileged: Callable[[Any, list[str]], str]


def _guess_interval(game: Any) -> tuple[int, int]:
    """The numbers the hints so far leave open."""
    low, high = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        if hint == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return low, high


def _guess_plan(game: Any) -> list[str]:
    """A binary search of the open interval, down to the secret."""
    low, high = _guess_interval(game)
    secret, guesses = game.game_number, []
    while low <= high:
        middle = (low + high) // 2
        guesses.append(f"[{middle}]")
        if middle == secret:
            break
        low, high = (middle + 1, high) if middle < secret else (low, middle - 1)
    return guesses


def _guess_admissible(game: Any) -> list[str]:
    return [f"[{n}]" for n in range(game.min_number, game.max_number + 1) if n not in game.guessed_numbers]


def _guess_privileged(game: Any, plan: list[str]) -> str:
    return f"The secret number is {game.game_number}." + (f" Binary search from here: {', '.join(plan)}." if plan else "")


def hanoi_moves(towers: dict[str, list[int]], target: str) -> list[tuple[str, str]]:
    """The fewest moves that stack every disk on ``target`` from any legal position (towers list
    their disks bottom to top): the largest disk not yet on ``target`` moves there once, after the
    smaller ones are stacked on the third tower, which is optimal."""
    where = {disk: name for name, disks in towers.items() for disk in disks}
    moves: list[tuple[str, str]] = []

    def stack(disk: int, onto: str) -> None:  # disks 1..disk onto `onto`
        if disk == 0:
            return
        if where[disk] == onto:
            stack(disk - 1, onto)
            return
        spare = next(name for name in towers if name not in (where[disk], onto))
        stack(disk - 1, spare)
        moves.append((where[disk], onto))
        where[disk] = onto
        stack(disk - 1, onto)

    stack(len(where), target)
    return moves


def _hanoi_plan(game: Any) -> list[str]:
    return [f"[{source} {target}]" for source, target in hanoi_moves(game.state.game_state["towers"], "C")]


def _hanoi_admissible(game: Any) -> list[str]:
    # TextArena also takes a move onto the same tower ("[A A]"): a no-op that spends a turn, not listed
    towers = game.state.game_state["towers"]
    return [f"[{source} {target}]" for source, target in itertools.permutations(towers, 2)
            if towers[source] and (not towers[target] or towers[target][-1] > towers[source][-1])]


def _hanoi_privileged(game: Any, plan: list[str]) -> str:
    return f"The fewest moves from here ({len(plan)}): {', '.join(plan)}." if plan else "The puzzle is solved."


EXPERTS: dict[str, GameExpert] = {
    "textarena.envs.GuessTheNumber.env:GuessTheNumberEnv": GameExpert(_guess_admissible, _guess_plan, _guess_privileged),
    "textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv": GameExpert(_hanoi_admissible, _hanoi_plan, _hanoi_privileged),
}


def _check_game(game: Any) -> None:
    if not isinstance(game, str) or f"{game}{_RAW}" not in ENV_REGISTRY:
        games = sorted(id for id in ENV_REGISTRY if f"{id}{_RAW}" in ENV_REGISTRY)  # no -raw, -train variants
        raise ConfigError(f"Unknown TextArena game {game!r}.{did_you_mean(str(game), games)} TextArena {ta.__version__} "
                          f"has {len(games)} games, e.g. {', '.join(games[:3])}; the single-player ones play here.")


def game_spec(game: str, **settings: Any) -> EnvSpec:
    """The ``EnvSpec`` of the TextArena game ``game`` (its own ``settings`` over TextArena's): the bracket
    format, TextArena's ``max_turns`` for it as the turn limit (else agentkit's default), ``train`` and
    ``eval`` seed ranges. No expert unless ``EXPERTS`` knows the game."""
    _check_game(game)
    max_turns = {**ENV_REGISTRY[game].kwargs, **settings}.get("max_turns")
    return EnvSpec(f"{__name__}:TextArenaEnv", {"game": game, **settings},
                   max_turns=max_turns if isinstance(max_turns, int) and max_turns > 0 else DEFAULT_MAX_TURNS,
                   splits=tuple(SPLIT_OFFSETS), action_format=BRACKET_ACTION_TAG, requires=("textarena",),
                   extra="textarena", description=f"TextArena {game}")


@contextlib.contextmanager
def _nltk_data(game: str) -> Iterator[None]:
    # word games (Wordle, Hangman, WordLadder, ...) load NLTK corpora and try to download them
    try:
        yield
    except LookupError as err:
        found = _NLTK_RESOURCE.search(str(err))
        resource = found.group(1).rsplit("/", 1)[-1] if found else "its word list"
        raise MissingDependencyError(
            f"TextArena game {game!r} needs NLTK's {resource!r} data, which is not here and could not be downloaded; "
            f"on a machine with internet run: python -m nltk.downloader {resource} (or set NLTK_DATA to a folder holding it)."
        ) from err


# -- the environment -----------------------------------------------------------------------------------
class TextArenaEnv(TextEnv):
    """One TextArena single-player game.

    Args:
        game: TextArena's id of the game (``GuessTheNumber-v0``, ``TowerOfHanoi-v0-medium``, ...).
        split: ``train`` or ``eval``: disjoint ranges of TextArena seeds.
        **settings: the game's own settings, over those TextArena registered (``max_number=50``).
    """

    def __init__(self, game: str = "GuessTheNumber-v0", split: str = "train", **settings: Any) -> None:
        if split not in SPLIT_OFFSETS:
            raise ConfigError(f"textarena split must be one of {list(SPLIT_OFFSETS)}, got {split!r}.")
        _check_game(game)
        self.game_id, self.split = game, split
        with _nltk_data(game):
            self._raw = ta.make(f"{game}{_RAW}", **settings)
        self._game = ActionFormattingWrapper(self._raw)
        self.expert = EXPERTS.get(ENV_REGISTRY[f"{game}{_RAW}"].entry_point)
        self._random: tuple | None = None  # the game's own state of Python's `random`
        self._task = ""
        self._score = 0.0
        self._done = True

    @contextlib.contextmanager
    def _game_random(self) -> Iterator[None]:
        """Run TextArena with the game's own ``random`` state and give the caller's back after."""
        outside = random.getstate()
        if self._random is not None:
            random.setstate(self._random)
        try:
            yield
        finally:
            self._random = random.getstate()
            random.setstate(outside)

    # -- the protocol ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        family = f"textarena/{self.game_id}"
        index = task_index(self.task_seed(seed, SEEDS_PER_SPLIT), SEEDS_PER_SPLIT, family=family, split=self.split)
        with self._game_random(), _nltk_data(self.game_id):
            try:
                self._game.reset(num_players=1, seed=SPLIT_OFFSETS[self.split] + index)
            except (AssertionError, ValueError) as err:  # TextArena's answer to a player count the game does not take
                raise ConfigError(f"TextArena game {self.game_id!r} does not start with one player ({err}); agentkit "
                                  "plays TextArena's single-player games.") from err
        if not isinstance(self._raw.state, ta.SinglePlayerState):
            raise ConfigError(f"TextArena game {self.game_id!r} is not a single-player game; agentkit plays TextArena's "
                              "single-player games.")
        messages = self._messages()
        self._task = clean_text("\n\n".join(text for text, kind in messages if kind == ta.ObservationType.PROMPT))
        self._score, self._done = 0.0, False
        return self._text(messages), self._info(valid=True, won=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise EnvError(f"step() called on a finished {self.game_id} episode; call reset() first.")
        with self._game_random():
            done, _ = self._game.step(action)
        state = self._raw.state
        player = state.current_player_id
        valid = state.error_count == 0 and not state.game_info[player]["invalid_move"]
        messages = self._messages()
        text = self._text(messages)
        previous, won = self._score, False
        if done:
            rewards, game_info = self._raw.close()
            self._score = float((rewards or {}).get(player, 0.0))
            won = self._score >= 1.0
            reason = game_info[player].get("reason")
            text = f"{text}\n\n{reason}".strip() if reason else text
            self._done = True
        return text, self._score - previous, bool(done), False, self._info(valid=valid, won=won)

    def close(self) -> None:
        pass  # TextArena's close() only reports the rewards; nothing to release

    # -- helpers -------------------------------------------------------------------------------------
    def _messages(self) -> list[tuple[str, Any]]:
        """The player's new messages as (text, TextArena observation type), its own action's echo left out."""
        _, messages = self._raw.get_observation()
        return [(str(text), kind) for _, text, kind in messages if kind != ta.ObservationType.PLAYER_ACTION]

    @staticmethod
    def _text(messages: list[tuple[str, Any]]) -> str:
        return "\n\n".join(text.strip() for text, _ in messages if text.strip())

    def _info(self, *, valid: bool, won: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"task": self._task, "admissible_actions": None, "action_valid": valid, "won": won,
                                "score": self._score, "privileged": None, "task_type": self.game_id}
        if self.expert is not None:
            plan = [] if self._done else self.expert.plan(self._raw)
            info.update(admissible_actions=[] if self._done else self.expert.admissible(self._raw), expert_plan=plan,
                        privileged=self.expert.privileged(self._raw, plan))
        return info
