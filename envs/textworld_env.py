"""TextWorld, offline: games generated locally from a seed, cached on disk.

Each ``reset(seed=s)`` plays the game generated from seed ``s`` of the chosen split. Train and
eval use disjoint seed ranges (eval seeds are offset by ``EVAL_SEED_OFFSET``) and, where the
challenge has them, its own held-out content (tw-simple's ``test`` objects, tw-cooking's
``valid`` recipes). Generation takes 1-3 s per game the first time; the compiled game is cached
under ``$AGENTKIT_CACHE/textworld`` and reused.

TextWorld reports a cumulative score; rewards here are its per-step differences. TextWorld has no
invalid-command flag: an action is valid when it is in the admissible commands of the state it was
played in. ``privileged`` is the expert plan from the current state (TextWorld's policy commands).

A reset plays exactly what ``textworld.start`` would, faster: each game's opening (the game read
from its file and the winning policy TextWorld searches for at every reset) is kept per process and
copied.

The coin collector's instruction spells out the route ("First step, go south. ... recover the
coin"). ``goal="brief"`` replaces it with ``BRIEF_COIN_GOAL`` in the first observation and the task,
so the agent has to find the way while the privileged expert plan still knows it: a privileged
context that carries what the agent's own prompt does not.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentkit.envs.gym import TextEnv

from agentkit.core.errors import ConfigError, EnvError
from agentkit.core.paths import build_folder_once, cache_dir

SEEDS_PER_SPLIT = 1_000_000
EVAL_SEED_OFFSET = 1_000_000

CHALLENGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-coin_collector": {"level": 5, "goal": "detailed"},
    "tw-treasure_hunter": {"level": 5},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False, "drop": False, "recipe_seed": 0},
}
# settings agentkit applies to what the agent sees; not passed to TextWorld's generator (same games)
_VIEW_SETTINGS = {"tw-coin_collector": {"goal": ("detailed", "brief")}}
BRIEF_COIN_GOAL = "Find the coin and take it."
_SAFE_COMMAND = re.compile(r"[^a-z0-9 ,.'-]")
_MAX_COMMAND_CHARS = 190  # the interpreter truncates longer input
_BANNER_CHARS = set(" _|$\\/<>")


def _strip_banner(text: str) -> str:
    lines = text.split("\n")
    i = 0
    while i < len(lines) and set(lines[i]) <= _BANNER_CHARS:
        i += 1
    return "\n".join(lines[i:])


def _challenge_settings(challenge: str, split: str, settings: dict[str, Any]) -> dict[str, Any]:
    full = {**CHALLENGE_DEFAULTS[challenge], **settings}
    for name in _VIEW_SETTINGS.get(challenge, {}):
        full.pop(name, None)
    if challenge == "tw-simple":
        full["test"] = split == "eval"  # held-out object names for eval
    elif challenge == "tw-cooking":
        full["split"] = "train" if split == "train" else "valid"
    return full


def _game_folder(challenge: str, split: str, seed: int, settings: dict[str, Any], root: Path | None) -> Path:
    full = _challenge_settings(challenge, split, settings)
    key = hashlib.sha1(json.dumps(full, sort_keys=True).encode()).hexdigest()[:10]
    return (root or cache_dir() / "textworld") / f"{challenge}-{key}" / f"{split}-{seed}"


def _cached(folder: Path) -> bool:
    return (folder / "game.z8").exists() and (folder / "game.json").exists()


_announced: set[tuple[Path, str]] = set()  # the game folders and splits this process has said it generates


def _announce(folder: Path, challenge: str, split: str, count: int | None) -> None:
    """Say once per process, cache folder and split that games are being generated, and where."""
    if (folder, split) in _announced:
        return
    _announced.add((folder, split))
    what = f"{count} TextWorld games" if count is not None else "TextWorld games"
    print(f"generating {what} for {challenge} ({split} split) on first use, 1-3 s each; cached under {folder}",
          file=sys.stderr, flush=True)


def generate_games(challenge: str, split: str, seeds: Iterable[int], settings: dict[str, Any],
                   root: Path | None = None) -> int:
    """Generate the games of ``seeds`` not yet in the cache, with a line and a progress bar on
    stderr (the bar only on a terminal); return how many were generated."""
    from tqdm import tqdm

    missing = [seed for seed in dict.fromkeys(seeds) if not _cached(_game_folder(challenge, split, seed, settings, root))]
    if missing:
        _announce(_game_folder(challenge, split, missing[0], settings, root).parent, challenge, split, len(missing))
        for seed in tqdm(missing, desc="TextWorld games", unit="game", file=sys.stderr, disable=None, leave=False):
            game_path(challenge, split, seed, settings, root)
    return len(missing)


def game_path(challenge: str, split: str, seed: int, settings: dict[str, Any], root: Path | None = None) -> Path:
    """Generate (once) and return the compiled game for this challenge, split and seed."""
    import textworld
    import textworld.challenges

    full = _challenge_settings(challenge, split, settings)
    folder = _game_folder(challenge, split, seed, settings, root)
    game_file = folder / "game.z8"
    if _cached(folder):
        return game_file
    _announce(folder.parent, challenge, split, None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    (folder.parent / "settings.json").write_text(json.dumps(full, sort_keys=True, indent=1))
    with build_folder_once(folder, "game.json") as tmp:
        options = textworld.GameOptions()
        options.seeds = (EVAL_SEED_OFFSET if split == "eval" else 0) + seed
        options.path = str(tmp / "game.z8")
        options.file_ext = ".z8"
        options.force_recompile = True
        make_game = textworld.challenges.CHALLENGES[challenge][1]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            game = make_game(full, options)
            textworld.generator.compile_game(game, options)
    return game_file


class _Openings:
    """Each game's opening, kept per process: the game read from its ``.json`` file and the quest
    progression TextWorld computes at the start of every episode (the winning policy, found by
    searching the game's quest trees). Without it each reset reads the file again and redoes that
    search, about half of a reset's time; with it a reset copies the progression. The game is
    shared read-only (TextWorld's own ``copy()`` shares it the same way). ``size`` games are kept
    (0.7-2 MB each), the least recently used one dropped first: a GRPO group's episodes start the
    same game, so all but the first copy it."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, int], tuple[Any, Any, Any]] = OrderedDict()
        self._lock = threading.Lock()  # environments may reset from several threads

    def get(self, game_file: Path) -> tuple[Any, Any, Any]:
        """``(game, progression, winning policy)`` of the game's first move; copy the progression
        before playing it."""
        from textworld import Game
        from textworld.generator.game import GameProgression

        json_file = game_file.with_suffix(".json")
        key = (str(json_file), json_file.stat().st_mtime_ns)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            game = Game.load(str(json_file))
            progression = GameProgression(game, track_quests=True)
            self._kept[key] = opening = (game, progression, progression.winning_policy)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
            return opening


_OPENINGS = _Openings()


@functools.cache
def _player_class() -> type:
    """TextWorld's state tracker with its opening read from ``_OPENINGS`` rather than recomputed
    (defined on first use: TextWorld is an optional dependency). It sets the tracker's own fields
    as TextWorld 1.7 does (the extra pins 1.7; ``tests/test_envs.py`` plays it against
    ``textworld.start`` state for state)."""
    from textworld.envs.wrappers.tw_inform7 import StateTracking

    class Player(StateTracking):
        def reset(self):  # StateTracking.reset, the opening copied
            _, progression, policy = self.opening
            self.state = self._wrapped_env.reset()
            self._send("tw-trace-actions")
            self._game_progression = progression.copy()
            self._last_action = None
            self._previous_winning_policy = None
            self._current_winning_policy = policy
            self._moves = 0
            self._gather_infos()
            return self.state

    return Player


def _start(game_file: Path, infos: Any) -> Any:
    """TextWorld's environment for a compiled game, as ``textworld.start`` builds it (the Z-machine
    under TextWorld's three Inform 7 wrappers), with the game and its opening from ``_OPENINGS``."""
    from textworld.envs.wrappers.tw_inform7 import GameData, Inform7Data
    from textworld.envs.zmachine.jericho import JerichoEnv

    opening = _OPENINGS.get(game_file)
    machine = JerichoEnv(infos)
    machine._game = opening[0]  # GameData.load takes the game from what it wraps when it has one
    player = _player_class()(Inform7Data(GameData(machine)))
    player.opening = opening
    player.load(str(game_file))
    return player


class TextWorldEnv(TextEnv):
    """A TextWorld challenge as an agentkit environment.

    Args:
        challenge: tw-simple, tw-coin_collector, tw-treasure_hunter or tw-cooking.
        split: "train" or "eval" (disjoint games).
        cache: folder for generated games (default ``$AGENTKIT_CACHE/textworld``).
        **settings: the challenge's settings (e.g. ``level=10``, ``rewards="sparse"``, ``recipe=2``).
    """

    def __init__(self, challenge: str = "tw-simple", split: str = "train", cache: str | None = None, **settings: Any) -> None:
        if challenge not in CHALLENGE_DEFAULTS:
            raise ConfigError(f"Unknown TextWorld challenge {challenge!r}; expected one of {sorted(CHALLENGE_DEFAULTS)}.")
        if split not in ("train", "eval"):
            raise ConfigError(f"split must be 'train' or 'eval', got {split!r}.")
        unknown = sorted(set(settings) - set(CHALLENGE_DEFAULTS[challenge]))
        if unknown:
            raise ConfigError(
                f"{challenge} has no setting(s) {unknown}; its settings are {sorted(CHALLENGE_DEFAULTS[challenge])}."
            )
        for name, allowed in _VIEW_SETTINGS.get(challenge, {}).items():
            if name in settings and settings[name] not in allowed:
                raise ConfigError(f"{challenge} setting {name}={settings[name]!r} is not one of {list(allowed)}.")
        import textworld  # noqa: F401  (fail early with the install hint)

        self.challenge = challenge
        self.split = split
        self.settings = settings
        self.cache = Path(cache) if cache else None
        self._env = None
        self._game_file: Path | None = None
        self._state = None
        self._score = 0.0
        self._done = True
        self._task = ""

    def prepare(self, seeds: Iterable[int]) -> None:
        """Generate the games of these task seeds now, with progress on stderr, rather than one by
        one at each first reset."""
        seeds = list(seeds)
        if bad := [seed for seed in seeds if not 0 <= seed < SEEDS_PER_SPLIT]:
            raise ConfigError(f"TextWorld task seeds run from 0 to {SEEDS_PER_SPLIT - 1}, got {bad[:3]}.")
        generate_games(self.challenge, self.split, seeds, self.settings, self.cache)

    def _infos(self):
        import textworld

        return textworld.EnvInfos(
            admissible_commands=True, policy_commands=True, won=True, lost=True, score=True,
            max_score=True, objective=True,
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        seed = self.task_seed(seed, SEEDS_PER_SPLIT)
        if not 0 <= seed < SEEDS_PER_SPLIT:
            raise ConfigError(f"TextWorld task seeds run from 0 to {SEEDS_PER_SPLIT - 1}, got {seed}.")
        game_file = game_path(self.challenge, self.split, seed, self.settings, self.cache)
        if game_file != self._game_file:
            self.close()
            with warnings.catch_warnings():
                # jericho warns that generated games lack its per-game tables; TextWorld tracks score itself
                warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                self._env = _start(game_file, self._infos())
            self._game_file = game_file
        state = self._env.reset()
        self._state, self._score, self._done = state, float(state.score or 0), False
        self._task = state.objective or ""
        obs = _strip_banner(state.feedback)
        if self.settings.get("goal") == "brief":
            room = obs.find("\n\n-= ")  # the instruction is everything before the first room's header
            if room < 0:
                raise EnvError(f"TextWorld's first observation of {game_file} has no room header after its "
                               "instruction, so goal='brief' cannot hide the route. Use goal='detailed'.")
            obs, self._task = BRIEF_COIN_GOAL + obs[room:], BRIEF_COIN_GOAL
        return obs, self._info(action_valid=True)

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        state = self._state
        plan = list(state.policy_commands or [])
        return {
            "task": self._task,
            "admissible_actions": list(state.admissible_commands or []),
            "action_valid": action_valid,
            "won": bool(state.won),
            "score": float(state.score or 0),
            "privileged": ("Expert plan from here: " + " > ".join(plan)) if plan else None,
            "expert_plan": plan,
            "max_score": float(state.max_score or 0),
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._env is None or self._done:
            raise EnvError("step() called before reset() or after the episode ended; call reset() first.")
        command = " ".join(str(action).split()).lower()
        valid = command in (self._state.admissible_commands or [])
        # the Z-machine interpreter reads a backslash as an interpreter escape (\quit, \help) and
        # chokes on non-ASCII: pass it only the characters game commands are made of
        safe = " ".join(_SAFE_COMMAND.sub(" ", command).split())
        if not safe or len(safe) > _MAX_COMMAND_CHARS:
            return "That command has no words the game understands.", 0.0, False, False, self._info(action_valid=False)
        state, _, done = self._env.step(safe)
        self._state = state
        score = float(state.score or 0)
        reward, self._score = score - self._score, score
        self._done = bool(done)
        return state.feedback, reward, self._done, False, self._info(action_valid=valid)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._game_file = None
