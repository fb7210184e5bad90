"""Vaults: a pure-Python toy environment with rules that hold across a family of tasks.

Each task is a "<family> vault": a row of ``chambers`` chambers, each with ``exits`` exits marked
with symbols (star, moon, anchor, ...). One marker is right in every chamber of every vault of a
family, the family's hidden rule ("In amber vaults take the exit marked anchor"); the others lead
to a dead end, from which ``go back`` returns to the chamber. The family name is in every
observation, the rule only in a skill (the starter bank ``vaults``) and in ``info['privileged']``,
so a policy can learn a family's rule, or learn to read it from a skill, and carry it to every
vault of the family.

- Moves: every step spends one of ``moves`` (a lamp that burns down); when they run out before the
  last chamber the episode ends, lost. With the defaults (3 chambers, 4 exits, 6 moves) the expert
  needs 3 moves, one wrong exit costs 2 (in and back) and can be recovered from, two cannot. A
  policy picking uniformly among the admissible actions wins about 5% of episodes. With
  ``dead_ends=False`` a wrong exit is sealed instead: one move spent, same chamber (three wrong
  tries in all can be afforded).
- Phrasings: ``go star``, ``take the star exit``, ``go through the star door``, ``enter star``,
  ``open the star door`` and plain ``star`` are the same action (``PHRASINGS``); the admissible
  list gives the canonical ``go <marker>`` / ``go back``, and ``info['action_read']`` the move as
  read in that form (judges compare it with the expert's action). Anything else is invalid: it spends a move
  and changes nothing else. (Model text without an ``<action>`` tag never reaches the environment:
  the action parser answers it without a move; the registered turn limit, 8, bounds those turns.)
- Rewards are per step: ``1/chambers`` for each chamber passed (``rewards="dense"``), or 1.0 for
  the last one only (``"sparse"``); a won episode returns 1.0 either way.
- Families: twelve named ones, ``META_FAMILIES`` and ``TARGET_FAMILIES`` (each marker is right in
  exactly one), and 240 generated ``PRACTICE_FAMILIES`` ("kalomi", ...) whose rules are drawn
  over all twelve markers: a policy taught on those cannot memorize a few rules and has to read
  each task's rule from its skill (``examples/vaults_bench`` SFTs on them and runs RL on the named
  ones). Chosen with ``families="meta" | "target" | "all"`` (= ``"named"``) ``| "practice"`` or a
  list of names. Seed ``s`` plays family ``s mod len(families)``, so consecutive seeds cycle
  through the families.
- Splits: ``train``, ``dev`` and ``test`` are disjoint seed ranges of ``SEEDS_PER_SPLIT`` tasks
  each (the layouts are drawn from ``split offset + seed``). The registration names ``dev`` the
  held-out split that training evaluates on, so training curves are dev curves and ``test`` is
  played only when asked for by name; ``eval``, the name other environments use for their
  held-out split, is accepted as an alias of ``dev``.
- ``info['task_type']`` is the family, so skills with ``applies_to: [vaults:<family>]`` reach its
  tasks only.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from agentkit.envs.gym import TextEnv
from agentkit.envs.protocol import task_index

from agentkit.core.errors import ConfigError, EnvError

# family -> the marker of its right exit (a fixed shuffle: neither order nor initials give it away)
RULES: dict[str, str] = {
    "amber": "anchor", "basalt": "moon", "cedar": "bell", "dusk": "shell",
    "ember": "crown", "frost": "leaf", "garnet": "wave", "harbor": "star",
    "indigo": "key", "juniper": "flame", "kelp": "sun", "lotus": "feather",
}
META_FAMILIES = ("amber", "basalt", "cedar", "dusk", "ember", "frost", "garnet", "harbor")
TARGET_FAMILIES = ("indigo", "juniper", "kelp", "lotus")
MARKERS = tuple(sorted(RULES.values()))


def _practice_families(count: int = 240) -> dict[str, str]:
    """Generated families ("kalomi", ...) whose rules are drawn over every marker: a policy taught
    on them cannot memorize a few fixed rules and has to read each task's rule from its skill."""
    rng = random.Random("vaults|practice")
    syllables = ("ka", "lo", "mi", "ru", "te", "sa", "no", "vi", "pe", "du", "zo", "ha")
    names = sorted({"".join(rng.choice(syllables) for _ in range(3)) for _ in range(4 * count)})
    rng.shuffle(names)
    return {name: rng.choice(MARKERS) for name in names[:count]}


PRACTICE_RULES = _practice_families()
PRACTICE_FAMILIES = tuple(PRACTICE_RULES)
FAMILY_RULES = {**RULES, **PRACTICE_RULES}  # every family, named and practice
FAMILY_SETS = {"meta": META_FAMILIES, "target": TARGET_FAMILIES, "all": META_FAMILIES + TARGET_FAMILIES,
               "named": META_FAMILIES + TARGET_FAMILIES, "practice": PRACTICE_FAMILIES}

SEEDS_PER_SPLIT = 1_000_000
SPLIT_OFFSETS = {"train": 0, "dev": SEEDS_PER_SPLIT, "test": 2 * SEEDS_PER_SPLIT}
SPLIT_ALIASES = {"eval": "dev"}
SPLITS = (*SPLIT_OFFSETS, *SPLIT_ALIASES)

# the words a phrasing may wrap around a marker: "go through the star door" == "go star"
PHRASINGS = ("go {m}", "take the {m} exit", "go through the {m} door", "enter {m}", "open the {m} door", "{m}")
_FILLER = frozenset("go take enter open use choose pick walk through the a an exit door doorway marked with to".split())
_BACK = frozenset({("go", "back"), ("back",), ("return",), ("go", "back", "to", "the", "chamber"), ("leave",)})
_WORD = re.compile(r"[a-z]+")


def rule_text(family: str) -> str:
    """The family's rule, as its skill states it."""
    return f"In {family} vaults take the exit marked {FAMILY_RULES[family]}."


def parse_families(families: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``meta``, ``target``, ``all``/``named``, ``practice``, a comma-separated string or a list of names."""
    if isinstance(families, str) and families in FAMILY_SETS:
        return FAMILY_SETS[families]
    if isinstance(families, str):
        names = [name.strip() for name in families.split(",") if name.strip()]
    elif isinstance(families, (list, tuple)) and all(isinstance(name, str) for name in families):
        names = [name.strip() for name in families]
    else:
        raise ConfigError(f"families must be 'meta', 'target', 'all', 'practice' or a list of family names, got {families!r}.")
    unknown = [name for name in names if name not in FAMILY_RULES]
    if unknown or not names:
        raise ConfigError(f"unknown vault families {unknown or names!r}; choose from {list(RULES)}, a practice "
                          "family, or a set: 'meta', 'target', 'all' (= 'named'), 'practice'.")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Vault:
    """One task: its family and, per chamber, the markers of its exits in the order shown."""

    family: str
    chambers: tuple[tuple[str, ...], ...]

    @property
    def marker(self) -> str:
        return FAMILY_RULES[self.family]


def make_vault(family: str, layout_seed: int, *, chambers: int, exits: int) -> Vault:
    rng = random.Random(f"vaults|{family}|{layout_seed}")
    right = FAMILY_RULES[family]
    others = [m for m in MARKERS if m != right]
    rows = []
    for _ in range(chambers):
        row = [right, *rng.sample(others, exits - 1)]
        rng.shuffle(row)
        rows.append(tuple(row))
    return Vault(family, tuple(rows))


def parse_move(action: str) -> str | None:
    """``'back'``, a marker name, or None for anything that is not a move."""
    words = tuple(_WORD.findall(action.lower()))
    if words in _BACK:
        return "back"
    rest = [w for w in words if w not in _FILLER]
    if len(rest) == 1 and rest[0] in RULES.values():
        return rest[0]
    return None


class VaultsEnv(TextEnv):
    """Pass every chamber of a vault by taking the exit its family's rule names.

    Args:
        split: ``train``, ``dev``, ``test`` (disjoint seed ranges) or ``eval`` (= ``dev``).
        families: ``all`` (= ``named``), ``meta``, ``target``, ``practice`` or a list of family names.
        chambers: chambers per vault.
        exits: exits per chamber (one right, the rest dead ends).
        moves: moves before the lamp burns out (the episode ends, lost).
        rewards: ``dense`` (1/chambers per chamber passed) or ``sparse`` (1.0 on winning).
        dead_ends: a wrong exit leads into a dead end (``go back`` returns, two moves in all); false:
            a wrong exit is sealed, the move is spent and the agent stays in the chamber.
    """

    def __init__(self, split: str = "train", families: str | list[str] = "all", chambers: int = 3, exits: int = 4,
                 moves: int = 6, rewards: str = "dense", dead_ends: bool = True) -> None:
        if split not in SPLITS:
            raise ConfigError(f"vaults split must be one of {list(SPLITS)}, got {split!r}.")
        for name, value, low, high in (("chambers", chambers, 1, 20), ("exits", exits, 2, len(MARKERS)),
                                       ("moves", moves, 1, 1000)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"vaults {name} must be an integer from {low} to {high}, got {value!r}.")
        if rewards not in ("dense", "sparse"):
            raise ConfigError(f"vaults rewards must be 'dense' or 'sparse', got {rewards!r}.")
        if not isinstance(dead_ends, bool):
            raise ConfigError(f"vaults dead_ends must be true or false, got {dead_ends!r}.")
        self.split = SPLIT_ALIASES.get(split, split)
        self.families = parse_families(families)
        self.num_chambers, self.num_exits, self.num_moves, self.rewards = chambers, exits, moves, rewards
        self.dead_ends = dead_ends
        self.vault: Vault | None = None
        self.chamber = 0
        self.in_dead_end = False
        self.moves_left = 0
        self.done = True

    def task(self, seed: int) -> Vault:
        """The vault that ``reset(seed=seed)`` plays."""
        index = task_index(seed, SEEDS_PER_SPLIT, family="vaults", split=self.split)
        family = self.families[index % len(self.families)]
        return make_vault(family, SPLIT_OFFSETS[self.split] + index, chambers=self.num_chambers, exits=self.num_exits)

    # -- the protocol ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.vault = self.task(self.task_seed(seed, SEEDS_PER_SPLIT))
        self.chamber, self.in_dead_end, self.moves_left, self.done = 0, False, self.num_moves, False
        family = self.vault.family
        intro = (f"You stand at the door of the {family} vault. Pass its {self.num_chambers} chambers by choosing "
                 f"the right exit in each; a wrong exit {'leads to a dead end' if self.dead_ends else 'is sealed'}. "
                 f"Your lamp lasts {self.num_moves} moves.")
        return f"{intro}\n{self._describe()}", self._info(valid=True, won=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.vault is None or self.done:
            raise EnvError("step() called on a finished vaults episode; call reset() first.")
        family = self.vault.family
        move = parse_move(action)
        self.moves_left -= 1
        reward, won = 0.0, False
        if self.in_dead_end:
            valid = move == "back"
            text = "You go back." if valid else "The only way out of the dead end is back (go back)."
            if valid:
                self.in_dead_end = False
        elif move in self.vault.chambers[self.chamber]:
            valid = True
            if move == self.vault.marker:
                self.chamber += 1
                reward = self._chamber_reward()
                won = self.chamber == self.num_chambers
                text = (f"You take the {move} exit and reach the treasure of the {family} vault. You win!" if won
                        else f"You take the {move} exit.")
            elif self.dead_ends:
                self.in_dead_end = True
                text = f"You take the {move} exit into a dead end. Go back to return to the chamber."
            else:
                text = f"The {move} exit is sealed; you stay in the chamber."
        else:
            valid = False
            text = "Nothing happens. Choose an exit with go <marker>."
        lost = not won and self.moves_left <= 0
        self.done = won or lost
        if lost:
            text += f" Your lamp burns out in the {family} vault. You lose."
        elif not won:
            text += "\n" + self._describe()
        read = "go back" if move == "back" else f"go {move}" if move else None
        return text, reward, self.done, False, {**self._info(valid=valid, won=won), "action_read": read}

    def close(self) -> None:
        pass

    # -- helpers -------------------------------------------------------------------------------------
    def _chamber_reward(self) -> float:
        if self.rewards == "dense":
            return 1.0 / self.num_chambers
        return 1.0 if self.chamber == self.num_chambers else 0.0

    def _describe(self) -> str:
        assert self.vault is not None
        family = self.vault.family
        if self.in_dead_end:
            return f"The {family} vault, a dead end off chamber {self.chamber + 1}. Moves left: {self.moves_left}."
        exits = ", ".join(self.vault.chambers[self.chamber])
        return (f"The {family} vault, chamber {self.chamber + 1} of {self.num_chambers}. "
                f"Exits are marked: {exits}. Moves left: {self.moves_left}.")

    def admissible(self) -> list[str]:
        assert self.vault is not None
        if self.done:
            return []
        if self.in_dead_end:
            return ["go back"]
        return [f"go {m}" for m in self.vault.chambers[self.chamber]]

    def expert_plan(self) -> list[str]:
        assert self.vault is not None
        if self.done:
            return []
        remaining = [f"go {self.vault.marker}"] * (self.num_chambers - self.chamber)
        return ["go back", *remaining] if self.in_dead_end else remaining

    def _info(self, *, valid: bool, won: bool) -> dict[str, Any]:
        assert self.vault is not None
        family = self.vault.family
        plan = self.expert_plan()
        privileged = rule_text(family) + (f" Plan from here: {', '.join(plan)}." if plan else "")
        return {
            "task": f"Cross the {family} vault: pass its {self.num_chambers} chambers by taking the right exit in each.",
            "admissible_actions": self.admissible(),
            "action_valid": valid,
            "won": won,
            "score": float(self.chamber) / self.num_chambers,
            "privileged": privileged,
            "expert_plan": plan,
            "task_type": family,
        }
