"""ScienceWorld (Wang et al., 2022): 30 elementary-science tasks in a simulator that runs in a JVM.

One ``ScienceWorldEnv`` owns one JVM, started by the ``scienceworld`` package through py4j and
reused across resets (starting a JVM takes seconds; loading another task into it well under two).

Tasks and seeds. ScienceWorld splits each task's variations into train, dev and test; ``split``
picks one of them (``"eval"`` is an alias of ``"dev"``). The split's (task, variation) pairs are
ordered round-robin over the selected tasks, in ScienceWorld's task numbering (1-1 boil, 1-2 melt,
..., 10-2 mendelian-genetics-unknown-plant): pair ``k*T + i`` is the ``k``-th variation of the
``i``-th task, skipping tasks that have run out of variations. With all 30 tasks, seeds 0-29 are
the first variation of every task, seeds 30-59 the second, and so on; ``task_for_seed`` shows the
mapping and ``num_tasks`` the count. The constructor asks the JVM for each selected task's
variations (about 0.1 s a task, once per process).

Simplifications default to ``"easy"`` (teleporting, open doors and containers, self-watering
flower pots, no electrical actions outside the electrical tasks), the preset ScienceWorld's README
runs its examples with; check what a paper you compare with used. ``simplifications=""`` plays the
full game.

Rewards and ends. ``info['score']`` is ScienceWorld's score (0-100; -100 after a fatal mistake such
as focusing on the wrong object) and the reward is its change divided by 100. Some tasks start above
zero (a subgoal already holds after the opening look), so a win returns ``1 - start/100``. Reaching
100 ends the episode won; a negative score ends it lost. ``step_limit`` optionally ends it
(truncated) once ScienceWorld's move counter passes the limit, as the package's ``envStepLimit``
does; counting agent turns is ``TurnLimit``'s job (``make(..., max_turns=N)``).

Validity. ``action_valid`` is False when the parser rejects the input ("No known action matches
that input.") and when the input is ambiguous. ScienceWorld answers an ambiguous input (one that
names several objects, e.g. "pick up wood cup" beside three wood cups) with a numbered list and
reads the *next* input as the number of the intended action, eating any other command. Here the
turn ends with the list (the game's own text, plus how to answer); if the next action is one of
the numbers it answers the question, as the gold sequences do with "0"; anything else cancels the
question first (ScienceWorld counts the cancel as one move of the clock) and is then played as
itself, so no command is ever eaten.

Admissible actions are ScienceWorld's valid action-object combinations (tens to hundreds of
milliseconds a step; ``admissible=False`` skips them and reports None). While a numbered question
is open they are its numbers followed by the list of the turn before.

Privileged text. ``privileged`` is the gold action sequence the simulator generates with the task
(from the start of the episode, at every step: nothing here replans, so a teacher's per-turn block
stays the reset's). ``info['expert_plan']`` is what is left of it: the gold sequence minus the
actions already played. It stays valid while the agent follows it (inputs the game
rejected, which change nothing, are allowed in between); the first other action that changes the
game empties it, since no planner can say how to go on from there.

Memory. Each JVM takes 0.7-1 GB with Java's defaults; ``java_heap_mb`` caps its heap (with the
serial collector, and exiting on out-of-memory so a starved JVM fails fast instead of thrashing).
The cap reaches the JVM through ``JAVA_TOOL_OPTIONS``, set only while the package spawns it and
restored afterwards, because the package passes no options to py4j's launcher. A JVM that dies
makes the next ``reset``/``step`` raise ``EnvError`` at once; ``close`` shuts it down.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from agentkit.envs.gym import TextEnv

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError, did_you_mean

SPLITS = {"train": "train", "dev": "dev", "eval": "dev", "test": "test"}
SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")
DEFAULT_SIMPLIFICATIONS = "easy"
DEFAULT_JAVA_HEAP_MB = 400
MIN_JAVA_HEAP_MB = 128
ELECTRICAL_TASKS = (
    "power-component", "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity", "test-conductivity-of-unknown-substances",
)
JAVA_INSTALL_HINT = "apt-get install -y openjdk-17-jre-headless"

_REJECTED = ("No known action matches that input.", "Unknown action.")
_AMBIGUOUS = "Ambiguous request:"
_CHOICE_LINE = re.compile(r"^(\d+):\s*(.*)$")
_FIRST_LOOK = "look around"
_CLOSE_TIMEOUT_S = 10.0

# (task, split) -> the split's variations; the same for every instance in this process
_SPLIT_CACHE: dict[tuple[str, str], list[int]] = {}
# JAVA_TOOL_OPTIONS is process-wide: one JVM launch at a time may change it
_LAUNCH_LOCK = threading.Lock()

T = TypeVar("T")


def task_names() -> list[str]:
    """The 30 task names in ScienceWorld's numbering (1-1 boil ... 10-2)."""
    from scienceworld.constants import ID2TASK

    return list(ID2TASK.values())


def _parse_tasks(tasks: str | Sequence[str] | None) -> list[str]:
    from scienceworld.constants import ID2TASK

    names = list(ID2TASK.values())
    if tasks is None:
        return names
    if isinstance(tasks, str):
        wanted = [t.strip() for t in tasks.split(",") if t.strip()]
    elif isinstance(tasks, Sequence) and all(isinstance(t, str) for t in tasks):
        wanted = [t.strip() for t in tasks]
    else:
        raise ConfigError(f"tasks must be None, a list of task names or a comma-separated string, got {tasks!r}.")
    if not wanted:
        raise ConfigError("tasks is empty; name at least one ScienceWorld task, or pass tasks=None for all 30.")
    chosen = set()
    for name in wanted:
        name = ID2TASK.get(name, name)  # task ids such as "1-1" work too
        if name not in names:
            raise ConfigError(
                f"Unknown ScienceWorld task {name!r}.{did_you_mean(name, names)} "
                f"The tasks are: {', '.join(names)} (or their ids 1-1 ... 10-2); tasks=None selects all."
            )
        chosen.add(name)
    return [n for n in names if n in chosen]  # ScienceWorld's order, whatever order they were listed in


def _parse_simplifications(simplifications: str | Sequence[str], tasks: Sequence[str]) -> str:
    if isinstance(simplifications, str):
        parts = [p.strip() for p in simplifications.split(",") if p.strip()]
    elif isinstance(simplifications, Sequence) and all(isinstance(p, str) for p in simplifications):
        parts = [p.strip() for p in simplifications if p.strip()]
    else:
        raise ConfigError(f"simplifications must be a comma-separated string, got {simplifications!r}.")
    known = ("easy", *SIMPLIFICATIONS)
    for part in parts:
        if part not in known:
            raise ConfigError(
                f"Unknown ScienceWorld simplification {part!r}.{did_you_mean(part, known)} "
                f"Use 'easy' (all of them), '' (none) or a comma-separated subset of {', '.join(SIMPLIFICATIONS)}."
            )
    electrical = [t for t in tasks if t in ELECTRICAL_TASKS]
    if "noElectricalAction" in parts and electrical:
        raise ConfigError(
            f"simplification 'noElectricalAction' removes the 'connect' actions that {', '.join(electrical)} "
            "need; drop it (the 'easy' preset keeps them for these tasks) or leave those tasks out."
        )
    return ",".join(dict.fromkeys(parts))


def _java_options(java_heap_mb: int | None) -> list[str]:
    if java_heap_mb is None:
        return []
    if isinstance(java_heap_mb, bool) or not isinstance(java_heap_mb, int) or java_heap_mb < MIN_JAVA_HEAP_MB:
        raise ConfigError(
            f"java_heap_mb must be an integer of at least {MIN_JAVA_HEAP_MB} (MB), or None for Java's default heap; "
            f"got {java_heap_mb!r}. {DEFAULT_JAVA_HEAP_MB} plays every task."
        )
    return [f"-Xmx{java_heap_mb}m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError"]


@contextlib.contextmanager
def _child_java_options(options: list[str]) -> Iterator[None]:
    """Add ``options`` to JAVA_TOOL_OPTIONS while a JVM is spawned, then restore the old value.

    The scienceworld package launches its JVM with py4j's ``launch_gateway`` and no Java options;
    the child inherits this process's environment at spawn time, and the JVM reads the variable.
    """
    with _LAUNCH_LOCK:
        old = os.environ.get("JAVA_TOOL_OPTIONS")
        if options:
            os.environ["JAVA_TOOL_OPTIONS"] = " ".join([old, *options] if old else options)  # ours last: they win
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("JAVA_TOOL_OPTIONS", None)
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = old


def _normalize(command: str) -> str:
    return " ".join(command.split()).lower()


class ScienceWorldEnv(TextEnv):
    """ScienceWorld as an agentkit environment (see the module docstring for the details).

    Args:
        split: "train", "dev" (alias "eval") or "test": ScienceWorld's own variation splits.
        tasks: None for all 30 tasks, or task names (or ids such as "1-1") as a list or a
            comma-separated string.
        simplifications: ScienceWorld's simplification string: "easy" (default), "" for none, or
            a comma-separated subset of ``SIMPLIFICATIONS``.
        admissible: report the valid actions each step (costs tens to hundreds of ms a step).
        java_heap_mb: the JVM's maximum heap in MB, or None for Java's default (0.7-1 GB RSS).
        step_limit: end the episode (truncated) once ScienceWorld's move counter exceeds this;
            None for no limit (limit agent turns with ``TurnLimit`` instead).
    """

    def __init__(
        self,
        split: str = "train",
        tasks: str | Sequence[str] | None = None,
        simplifications: str = DEFAULT_SIMPLIFICATIONS,
        *,
        admissible: bool = True,
        java_heap_mb: int | None = DEFAULT_JAVA_HEAP_MB,
        step_limit: int | None = None,
    ) -> None:
        if not isinstance(split, str) or split not in SPLITS:
            raise ConfigError(
                f"split must be one of {', '.join(repr(s) for s in SPLITS)}, got {split!r}.{did_you_mean(str(split), SPLITS)}"
            )
        if not isinstance(admissible, bool):
            raise ConfigError(f"admissible must be True or False, got {admissible!r}.")
        if step_limit is not None and (isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1):
            raise ConfigError(f"step_limit must be a positive integer or None, got {step_limit!r}.")
        java_options = _java_options(java_heap_mb)
        try:
            import scienceworld
        except ImportError as err:
            raise MissingDependencyError(
                "ScienceWorld needs the scienceworld package: pip install 'agentkit[scienceworld]'", name="scienceworld"
            ) from err
        self.split = SPLITS[split]
        self.tasks = _parse_tasks(tasks)
        self.simplifications = _parse_simplifications(simplifications, self.tasks)
        self.admissible = admissible
        self.java_heap_mb = java_heap_mb
        self.step_limit = step_limit
        if shutil.which("java") is None:
            raise MissingDependencyError(
                "ScienceWorld runs in a Java VM and no `java` is on PATH. Install a Java runtime (8 or newer), "
                f"e.g.: {JAVA_INSTALL_HINT}"
            )

        self._sw: Any = None
        self._process: subprocess.Popen | None = None
        self._pairs: list[tuple[str, int]] | None = None
        self._dead: str | None = None
        self._reset_episode_state()
        with _child_java_options(java_options):
            try:
                # envStepLimit is the package wrapper's; its step() is bypassed, so step_limit is applied here
                self._sw = scienceworld.ScienceWorldEnv("", envStepLimit=1 << 30)
            except Exception as err:
                raise EnvError(
                    f"Could not start ScienceWorld's JVM ({type(err).__name__}: {err}). Check that `java -version` "
                    f"works; if Java is missing: {JAVA_INSTALL_HINT}"
                ) from err
        # the package keeps py4j's handle on the JVM process here; it tells us when the JVM has died
        self._process = getattr(getattr(self._sw, "_gateway", None), "java_process", None)
        try:
            self._split_pairs()  # loads tasks into the JVM: do it now, never in the middle of an episode
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ seeds and splits

    @property
    def num_tasks(self) -> int:
        """How many (task, variation) pairs the split holds: seeds run from 0 to num_tasks - 1."""
        return len(self._split_pairs())

    def task_for_seed(self, seed: int) -> tuple[str, int]:
        """The (task name, variation) that ``reset(seed=seed)`` plays."""
        pairs = self._split_pairs()
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < len(pairs):
            raise ConfigError(
                f"ScienceWorld seeds of the {self.split!r} split of these {len(self.tasks)} task(s) run from 0 to "
                f"{len(pairs) - 1}, got {seed!r}."
            )
        return pairs[seed]

    def _split_pairs(self) -> list[tuple[str, int]]:
        if self._pairs is None:
            variations = [self._variations(task) for task in self.tasks]
            rounds = max(len(v) for v in variations)
            self._pairs = [
                (task, v[k]) for k in range(rounds) for task, v in zip(self.tasks, variations, strict=True) if k < len(v)
            ]
        return self._pairs

    def _variations(self, task: str) -> list[int]:
        key = (task, self.split)
        if key not in _SPLIT_CACHE:
            server = self._server()
            self._call(server.load, task, 0, "", False)  # the split lists describe the loaded task
            lists = {"train": server.getVariationsTrain, "dev": server.getVariationsDev, "test": server.getVariationsTest}
            for name, get in lists.items():
                _SPLIT_CACHE[(task, name)] = [int(v) for v in self._call(get)]
        return _SPLIT_CACHE[key]

    # ------------------------------------------------------------------ the episode

    def _reset_episode_state(self) -> None:
        self._loaded: tuple[str, int] | None = None
        self._task = ""
        self._gold: list[str] = []
        self._plan_pos = 0
        self._on_plan = True
        self._score = 0
        self._done = True
        self._choices: list[str] | None = None  # the open numbered question, if any
        self._choices_on_plan = False
        self._admissible: list[str] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if options:
            raise ConfigError(f"ScienceWorldEnv.reset takes no options, got {sorted(options)}; choose the task with seed.")
        server = self._server()
        seed = self.task_seed(seed, self.num_tasks)
        task, variation = self.task_for_seed(seed)
        self._reset_episode_state()
        error = self._call(server.load, task, variation, self.simplifications, True)
        if error:
            raise EnvError(f"ScienceWorld could not load task {task!r} variation {variation}: {error}")
        self._loaded = (task, variation)
        self._task = str(self._call(server.getTaskDescription))
        self._gold = [str(a) for a in self._call(server.getGoldActionSequence)]
        obs = str(self._call(server.step, _FIRST_LOOK))
        self._score = self._read_score()
        self._done = False
        self._admissible = self._valid_actions()
        return obs, self._info(action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._sw is None:
            raise EnvError("step() called after close(); build a new ScienceWorldEnv.")
        if self._done:
            raise EnvError("step() called before reset() or after the episode ended; call reset() first.")
        server = self._server()
        command = " ".join(str(action).split())
        choices, choices_on_plan, self._choices = self._choices, self._choices_on_plan, None
        answered = choices is not None and command.isascii() and command.isdigit() and int(command) < len(choices)
        cancelled = choices is not None and not answered
        if cancelled:
            # any input answers ScienceWorld's question; a blank one cancels it, then the command runs
            self._call(server.step, "")
        obs = str(self._call(server.step, command))

        ambiguous = obs.startswith(_AMBIGUOUS)
        executed = not ambiguous and not obs.startswith(_REJECTED)
        on_plan = (
            self._on_plan and self._plan_pos < len(self._gold)
            and _normalize(command) == _normalize(self._gold[self._plan_pos])
            and (not answered or choices_on_plan)
        )
        if on_plan:
            self._plan_pos += 1
        elif executed or answered or (cancelled and choices_on_plan):
            self._on_plan = False  # the game moved off the gold path (or dropped the plan's own action)
        if ambiguous:
            self._choices = [m.group(2) for line in obs.splitlines() if (m := _CHOICE_LINE.match(line.strip()))]
            self._choices_on_plan = on_plan
            obs = self._ambiguity_text(command, self._choices)

        score = self._read_score()
        reward, self._score = (score - self._score) / 100.0, score
        terminated = score >= 100 or score < 0 or bool(self._call(server.getCompleted))
        truncated = (
            not terminated and self.step_limit is not None and int(self._call(server.getNumMoves)) > self.step_limit
        )
        self._done = terminated or truncated
        if self._choices is not None:
            self._admissible = None if not self.admissible else [str(i) for i in range(len(self._choices))] + (
                [a for a in (self._admissible or []) if not a.isdigit()]
            )
        elif self._done:
            self._admissible = [] if self.admissible else None
        else:
            self._admissible = self._valid_actions()
        return obs, reward, terminated, truncated, self._info(action_valid=executed)

    @staticmethod
    def _ambiguity_text(command: str, choices: list[str]) -> str:
        lines = [f"Ambiguous request: {command!r} could mean several things:"]
        lines += [f"{i}: {choice}" for i, choice in enumerate(choices)]
        lines.append("Answer with the number of the one you mean, or enter another command to cancel this one.")
        return "\n".join(lines)

    def _read_score(self) -> int:
        return int(round(100 * float(self._call(self._server().getScore))))

    def _valid_actions(self) -> list[str] | None:
        if not self.admissible:
            return None
        return [str(a) for a in self._call(self._server().getValidActionObjectCombinations)]

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        plan = self._gold[self._plan_pos:] if self._on_plan else []
        task, variation = self._loaded or ("", -1)
        return {
            "task": self._task,
            "admissible_actions": list(self._admissible) if self._admissible is not None else None,
            "action_valid": action_valid,
            "won": self._score >= 100,
            "score": float(self._score),
            "privileged": ("Gold action sequence from the start: " + " > ".join(self._gold)) if self._gold else None,
            "expert_plan": plan,
            "task_name": task,
            "variation": variation,
        }

    # ------------------------------------------------------------------ the JVM

    @property
    def jvm_pid(self) -> int | None:
        """The process id of this environment's JVM (None once closed)."""
        return self._process.pid if self._process is not None and self._sw is not None else None

    def _server(self) -> Any:
        if self._sw is None:
            raise EnvError("This ScienceWorldEnv is closed; build a new one.")
        return self._sw.server

    def _call(self, method: Callable[..., T], *args: Any) -> T:
        """Call the JVM; a dead or failing JVM raises EnvError (py4j would log and raise its own errors)."""
        from py4j.protocol import Py4JError

        self._check_alive()
        try:
            return method(*args)
        except Py4JError as err:
            self._check_alive()  # died during the call: say so plainly
            raise EnvError(f"ScienceWorld's JVM failed: {type(err).__name__}: {err}") from err

    def _check_alive(self) -> None:
        if self._dead is None and self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            self._dead = f"ScienceWorld's JVM (pid {self._process.pid}) has exited ({how})"
        if self._dead is not None:
            self._done = True
            raise EnvError(f"{self._dead}; this environment cannot continue. Close it and build a new one.")

    def close(self) -> None:
        sw, self._sw = self._sw, None
        if sw is None:
            return
        self._done = True
        try:
            sw.close()  # shuts the gateway down and tells the JVM to exit
        except Exception:  # noqa: BLE001 - a dead JVM cannot be closed politely; it is reaped below
            pass
        process = self._process
        if process is not None and process.poll() is None:
            try:
                process.wait(timeout=_CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
