"""ALFWorld (text), offline: games generated from the alfworld wheel, or the official games.

``reset(seed=s)`` plays task ``s`` of the split. With the generated source (the default when no
official data is found), seeds cycle through the chosen task types in ``TASK_TYPES`` order: seed
``s`` is game ``s // n`` of task type ``s % n`` (``n`` task types), so the games of one task type
are the same whichever other types are chosen. Games are generated on first use by
``agentkit.envs.alfworld.gen`` (see there for how, and for the splits) and cached under
``$AGENTKIT_CACHE/alfworld``. With the official data (``ALFWORLD_DATA`` holding
``json_2.1.1/{train,valid_seen,valid_unseen,valid_train}``), seed ``s`` plays the ``s % N``-th of the
split's ``N`` games of the chosen task types, sorted by path, skipping what ALFWorld skips (movable
and sliced tasks, games not marked solvable). The official split names are accepted: ``valid_seen``
is ``eval_in``, ``valid_unseen`` is ``eval_out``, and ``valid_train`` exists only there. The
process the user started says once on stderr which games it plays, and first-use generation says
so too (``prepare(seeds)`` generates a rollout's games up front, with a progress bar).

Rewards are sparse: 1 on the step that wins, else 0; winning ends the episode. An action is valid
when it is in the admissible commands of the state it was played in; the game answers anything
else with "Nothing happens.". ``privileged`` and ``expert_plan`` are fast-downward's plan from the
current state (ALFWorld's "planner" expert). Replanning is the slow part of a step, so the plan is
recomputed only when an action leaves it: following the plan, an invalid action, or looking
around (look, inventory, examine, help change nothing a plan depends on) keep the rest of it.
A reset costs about half a second of CPU even for a cached game: TextWorld translates the PDDL
problem for fast-downward on every load and reset, as it does inside ALFWorld.

``import alfworld`` sets ALFWORLD_DATA to ``~/.cache/alfworld`` (creating it) when unset. The
constructor reads the variable before that import; in a process that imported alfworld earlier,
"auto" also picks up official games downloaded to that default folder.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import operator
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentkit.envs.alfworld.gen import (
    SEEDS_PER_SPLIT,
    SPLIT_ALIASES,
    SPLITS,
    TASK_TYPES,
    announce_generation,
    game_folder,
    generate_game,
    is_generated,
    normalize_split,
)
from agentkit.envs.gym import TextEnv

from agentkit.core.errors import ConfigError, EnvError, did_you_mean

SOURCES = ("auto", "generated", "official")
OFFICIAL_SPLIT_FOLDERS = {"train": "train", "eval_in": "valid_seen", "eval_out": "valid_unseen",
                          "valid_train": "valid_train"}
# the official data's valid_train (games of train tasks held apart for evaluation) has no generated twin
OFFICIAL_ONLY_SPLITS = ("valid_train",)
_ALFRED_TO_SHORT = {alfred: short for short, alfred in TASK_TYPES.items()}
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
# actions whose effects no goal or precondition reads: the plan stays valid after them
_OBSERVING_VERBS = frozenset({"look", "inventory", "examine", "help"})


def parse_task_types(task_types: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Short task type names in ``TASK_TYPES`` order; accepts ALFWorld's long names too."""
    if task_types is None:
        return list(TASK_TYPES)
    if isinstance(task_types, str):
        names = [name.strip() for name in task_types.split(",") if name.strip()]
    elif isinstance(task_types, (list, tuple)) and all(isinstance(name, str) for name in task_types):
        names = [name.strip() for name in task_types]
    else:
        raise ConfigError(
            f"task_types must be None (all six), a list of names or a comma-separated string, got {task_types!r}."
        )
    if not names:
        raise ConfigError(f"task_types is empty; name at least one of {list(TASK_TYPES)}, or pass None for all six.")
    chosen = set()
    for name in names:
        short = _ALFRED_TO_SHORT.get(name, name)
        if short not in TASK_TYPES:
            raise ConfigError(
                f"Unknown ALFWorld task type {name!r}.{did_you_mean(name, [*TASK_TYPES, *_ALFRED_TO_SHORT])} "
                f"The task types are {list(TASK_TYPES)}."
            )
        chosen.add(short)
    return [name for name in TASK_TYPES if name in chosen]


def official_root(data: str | os.PathLike | None) -> Path | None:
    """The folder holding train/valid_seen/valid_unseen under ``ALFWORLD_DATA``, if any."""
    if not data:
        return None
    for folder in (Path(data) / "json_2.1.1", Path(data)):
        if any((folder / name).is_dir() for name in OFFICIAL_SPLIT_FOLDERS.values()):
            return folder
    return None


def _has_games(folder: Path) -> bool:
    return folder.is_dir() and next(folder.rglob("game.tw-pddl"), None) is not None


def _official_task_type(game_file: Path, folder: Path) -> str | None:
    # the task folder is named after its type ("pick_clean_then_place_in_recep-Apple-None-Fridge-1");
    # traj_data.json says it too
    for part in game_file.relative_to(folder).parts[:-1]:
        short = _ALFRED_TO_SHORT.get(part.split("-")[0])
        if short:
            return short
    traj_data = game_file.with_name("traj_data.json")
    if traj_data.exists():
        return _ALFRED_TO_SHORT.get(json.loads(traj_data.read_text()).get("task_type", ""))
    return None


def official_games(root: Path, split: str, task_types: list[str]) -> list[Path]:
    """The official games ALFWorld would play for this split and these task types, sorted."""
    folder = root / OFFICIAL_SPLIT_FOLDERS[normalize_split(split)]
    games = []
    for game_file in sorted(folder.rglob("game.tw-pddl")) if folder.is_dir() else []:
        relative = game_file.relative_to(folder).as_posix()
        if "movable" in relative or "Sliced" in relative:  # ALFWorld skips these task variants
            continue
        if _official_task_type(game_file, folder) not in task_types:
            continue
        if not json.loads(game_file.read_text()).get("solvable", False):
            continue
        games.append(game_file)
    return games


class _Engine:
    """TextWorld's PDDL engine (one private copy of fast-downward's library) with ALFWorld's names."""

    def __init__(self) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        self._pddl = PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True))
        self._game = AlfredDemangler(self._pddl)
        self._loaded: str | None = None

    def load(self, game: dict[str, Any]) -> None:
        key = hashlib.sha1((game["pddl_problem"] + game["grammar"]).encode()).hexdigest()
        if key != self._loaded:
            self._game.load(game)
            self._loaded = key

    def reset(self, *, plan: bool):
        self._pddl.request_infos.policy_commands = plan
        return self._game.reset()

    def step(self, command: str, *, plan: bool):
        self._pddl.request_infos.policy_commands = plan
        state, _, _ = self._game.step(command)
        return state

    def solve(self, game: dict[str, Any]) -> list[str]:
        """The planner's plan for a new game; [] when it finds none or the game starts won."""
        self.load(game)
        state = self.reset(plan=True)
        return [] if state["won"] else list(state["policy_commands"] or [])

    def close(self) -> None:
        # free the planner's task and search memory (PddlEnv.close() does nothing). The library
        # copy itself stays mapped: unloading it (fast_downward.close_lib) crashes the process
        # later, in the next load or at exit. About 1.5 MB stays resident per closed engine.
        self._pddl.downward_lib.cleanup()
        self._pddl = self._game = None
        self._loaded = None


_said: set[tuple[str, str, str]] = set()


def _say_source(source: str, split: str, official: Path | None, cache: Path | None) -> None:
    """Which games are played, once per process and source (the process the user started: not
    its environment workers, which would repeat it)."""
    where = str(official / OFFICIAL_SPLIT_FOLDERS[split]) if official is not None else \
        str(game_folder(split, next(iter(TASK_TYPES)), 0, cache).parent.parent)
    if (source, split, where) in _said or multiprocessing.parent_process() is not None:
        return
    _said.add((source, split, where))
    if official is not None:
        print(f"ALFWorld: playing the official games at {where} (split {split})", file=sys.stderr, flush=True)
    else:
        print(f"ALFWorld: playing generated games (split {split}, cached under {where}); set ALFWORLD_DATA to the "
              "official data to play those", file=sys.stderr, flush=True)


def clean_observation(text: str) -> str:
    """ALFWorld's text without TextWorld's welcome banner."""
    return text.replace(_BANNER, "").strip()


class AlfWorldEnv(TextEnv):
    """ALFWorld's text games as an agentkit environment.

    Args:
        split: "train", "eval_in" (seen floor plans, other games; "eval" is an alias) or
            "eval_out" (held-out floor plans). The official data's names work too: valid_seen
            (eval_in), valid_unseen (eval_out), and valid_train (official games only).
        task_types: None for all six, or a list (or comma-separated string) of
            pick_and_place, look_at_obj_in_light, pick_clean_then_place, pick_heat_then_place,
            pick_cool_then_place, pick_two_obj_and_place (ALFWorld's long names work too).
        source: "auto" (the official games when ALFWORLD_DATA holds them, else generated ones),
            "generated" or "official".
        cache: folder for generated games (default ``$AGENTKIT_CACHE/alfworld``).
        expert_plan: compute the planner's plan (``privileged``, ``expert_plan``); False skips
            the planner while playing (generation still runs it once per game).
    """

    def __init__(
        self,
        split: str = "train",
        task_types: str | list[str] | None = None,
        source: str = "auto",
        cache: str | os.PathLike | None = None,
        expert_plan: bool = True,
    ) -> None:
        if normalize_split(split) not in (*SPLITS, *OFFICIAL_ONLY_SPLITS):
            names = [*SPLITS, *SPLIT_ALIASES, *OFFICIAL_ONLY_SPLITS]
            raise ConfigError(
                f"Unknown ALFWorld split {split!r}.{did_you_mean(str(split), names)} The splits are {list(SPLITS)} "
                "('eval' and the official 'valid_seen' are 'eval_in', 'valid_unseen' is 'eval_out'; the official "
                "data's 'valid_train' too)."
            )
        if source not in SOURCES:
            raise ConfigError(f"source must be one of {list(SOURCES)}, got {source!r}.{did_you_mean(str(source), SOURCES)}")
        if not isinstance(expert_plan, bool):
            raise ConfigError(f"expert_plan must be True or False, got {expert_plan!r}.")
        self.split = normalize_split(split)
        self.task_types = parse_task_types(task_types)
        # read before importing alfworld, whose import sets ALFWORLD_DATA to its default cache
        data = os.environ.get("ALFWORLD_DATA")
        import alfworld  # noqa: F401  (fail early: the factory's ImportError names the extra)
        import textworld  # noqa: F401

        root = official_root(data)
        if source == "official" and root is None:
            raise ConfigError(
                f"source='official' needs ALFWORLD_DATA to point at ALFWorld's data (a folder with "
                f"json_2.1.1/train, valid_seen, valid_unseen); ALFWORLD_DATA is {data!r}. "
                "Download it with alfworld-download, or use source='generated'."
            )
        if source == "auto":
            official = root is not None and _has_games(root / OFFICIAL_SPLIT_FOLDERS[self.split])
            source = "official" if official else "generated"
        if source == "generated" and self.split in OFFICIAL_ONLY_SPLITS:
            raise ConfigError(
                f"ALFWorld split {split!r} exists only in the official data (json_2.1.1/{split}), and ALFWORLD_DATA "
                f"({data!r}) holds no games there. Point ALFWORLD_DATA at the official data, or play a generated "
                f"split: {list(SPLITS)}."
            )
        self.source = source
        self.official_root = root if source == "official" else None
        self.cache = Path(cache) if cache else None
        _say_source(self.source, self.split, self.official_root, self.cache)
        self.expert_plan = expert_plan
        self._engine: _Engine | None = None
        self._official_games: list[Path] | None = None
        self._state = None
        self._plan: list[str] = []
        self._done = True
        self._task = ""
        self._task_type = ""
        self._game_file = ""

    def prepare(self, seeds: Iterable[int]) -> None:
        """Generate the games of these task seeds now, with progress on stderr, rather than one by
        one at each first reset (nothing to do for the official games)."""
        if self.source != "generated":
            return
        from tqdm import tqdm

        tasks = [(self.task_types[seed % len(self.task_types)], seed // len(self.task_types))
                 for seed in dict.fromkeys(self._check_seed(seed) for seed in seeds)]
        missing = [(task_type, index) for task_type, index in tasks
                   if not is_generated(game_folder(self.split, task_type, index, self.cache))]
        if missing:
            announce_generation(self.split, self.cache, len(missing))
            for task_type, index in tqdm(missing, desc="ALFWorld games", unit="game", file=sys.stderr, disable=None,
                                         leave=False):
                generate_game(self.split, task_type, index, self._engine_ready().solve, self.cache)

    def _engine_ready(self) -> _Engine:
        if self._engine is None:
            self._engine = _Engine()
        return self._engine

    def _game_for(self, seed: int) -> tuple[Path, str]:
        if self.source == "generated":
            task_type = self.task_types[seed % len(self.task_types)]
            index = seed // len(self.task_types)
            return generate_game(self.split, task_type, index, self._engine_ready().solve, self.cache), task_type
        if self._official_games is None:
            self._official_games = official_games(self.official_root, self.split, self.task_types)
        if not self._official_games:
            # ALFWorld's own environment spins forever in reset() on an empty game list
            raise EnvError(
                f"No ALFWorld games found under {self.official_root / OFFICIAL_SPLIT_FOLDERS[self.split]} "
                f"for task types {self.task_types} (split {self.split!r}); expected folders of "
                "*/*/game.tw-pddl marked solvable. Check ALFWORLD_DATA, or use source='generated'."
            )
        game_file = self._official_games[seed % len(self._official_games)]
        return game_file, _official_task_type(game_file, self.official_root) or ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        seed = self._check_seed(self.task_seed(seed, SEEDS_PER_SPLIT))
        game_file, self._task_type = self._game_for(seed)
        engine = self._engine_ready()
        engine.load(json.loads(game_file.read_text()))
        self._game_file = str(game_file)
        state = engine.reset(plan=self.expert_plan)
        self._state, self._done = state, bool(state["won"])
        self._plan = list(state["policy_commands"] or []) if self.expert_plan else []
        obs = clean_observation(state["feedback"])
        self._task = obs.rsplit("Your task is to: ", 1)[-1].strip() if "Your task is to: " in obs else ""
        return obs, self._info(action_valid=True)

    @staticmethod
    def _check_seed(seed: Any) -> int:
        try:
            index = -1 if isinstance(seed, bool) else operator.index(seed)  # numpy integers too
        except TypeError:
            index = -1
        if not 0 <= index < SEEDS_PER_SPLIT:
            raise ConfigError(f"ALFWorld task seeds are integers from 0 to {SEEDS_PER_SPLIT - 1}, got {seed!r}.")
        return index

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        won = bool(self._state["won"])
        info = {
            "task": self._task,
            "admissible_actions": list(self._state["admissible_commands"] or []),
            "action_valid": action_valid,
            "won": won,
            "score": 1.0 if won else 0.0,
            "privileged": ("Expert plan from here: " + " > ".join(self._plan)) if self._plan else None,
            "task_type": self._task_type,
            "game_file": self._game_file,
        }
        if self.expert_plan:
            info["expert_plan"] = list(self._plan)
        return info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._engine is None or self._state is None or self._done:
            raise EnvError("step() called before reset() or after the episode ended; call reset() first.")
        command = " ".join(str(action).split()).lower()
        valid = command in (self._state["admissible_commands"] or [])
        replan = False
        if valid and self.expert_plan:
            if self._plan and command == self._plan[0]:
                self._plan = self._plan[1:]
            elif command.split()[0] not in _OBSERVING_VERBS:
                replan = True
        state = self._engine.step(command, plan=replan)
        if replan:
            self._plan = list(state["policy_commands"] or [])
        self._state = state
        won = bool(state["won"])
        if won:
            self._plan = []
        self._done = won
        return clean_observation(state["feedback"]), 1.0 if won else 0.0, won, False, self._info(action_valid=valid)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._state = None
        self._done = True
