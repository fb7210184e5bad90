"""ALFWorld games generated offline from what the alfworld wheel ships.

The official ALFWorld games are PDDL problems written from AI2-THOR scenes; the scenes are not in
the wheel, but the floor plans' object lists (``gen/layouts/FloorPlan*-objects.json``), their
receptacle lists (``*-openable.json``), the object tables (``alfworld.gen.constants``), the goal
library, the PDDL domain and the grammar are. From those this module writes games in ALFWorld's
own format (``game.tw-pddl`` plus a ``traj_data.json`` with the fields ALFWorld reads), for the six
task types ALFWorld plays.

How a game is made (``sample_game``), each step drawn from one ``random.Random`` seeded by
(task type, generation seed, attempt):

1. a floor plan among those of the split that admit the task type (``floor_plans``): ALFRED's room
   rule (``GOALS_VALID``: heating only in kitchens, lamps only in living rooms and bedrooms...) and
   the objects and appliances the task needs;
2. the target object type and, for placing tasks, the target receptacle type, with ALFRED's
   filters (an object to cool is never found in the fridge, the target receptacle is never the
   appliance, and no object of the target type starts in a receptacle of the target type);
3. the receptacles of the floor plan (counts from the layout, at most ``MAX_PER_RECEPTACLE_TYPE``
   of a type, each at its own location); one to three instances of the target (two or three for
   ``pick_two_obj_and_place``) and one or two of each of up to ``MAX_DISTRACTOR_TYPES`` other
   object types of the floor plan, each in a receptacle that may hold it;
4. the task sentence from the goal library's templates (``add_task_to_grammar``).

The planner (fast-downward, through TextWorld) then solves the game; an unsolvable game or one
already won is drawn again with the next attempt. The plan is stored as the game's walkthrough.

Departures from the official games, on purpose: one location per receptacle (THOR scenes put
some side by side, which makes "go to" reach two); no object starts cool in the fridge; no sliced
objects and no movable-receptacle tasks (ALFWorld skips those too); lamps stand on a piece of
furniture (THOR puts floor lamps on the floor, which the goal cannot express).

Splits follow ALFWorld's: ``train`` and ``eval_in`` ("valid_seen") share floor plans and use
disjoint generation seeds; ``eval_out`` ("valid_unseen") uses only ``HELD_OUT_FLOOR_PLANS``, the
four scenes ALFRED holds out for its unseen validation set, which no other split uses.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentkit.core.errors import ConfigError, EnvError
from agentkit.core.paths import build_folder_once, cache_dir

GENERATOR_VERSION = "gen-v1"  # part of the cache path: bump when generated games change

# short name -> ALFWorld's task type (the order is the order seeds cycle through)
TASK_TYPES: dict[str, str] = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place": "pick_two_obj_and_place",
}

SPLITS = ("train", "eval_in", "eval_out")
# other names of the splits: ours short, and the official data's folders
SPLIT_ALIASES = {"eval": "eval_in", "valid_seen": "eval_in", "valid_unseen": "eval_out"}
SEEDS_PER_SPLIT = 1_000_000
# generation seeds of split k are k * SEEDS_PER_SPLIT + index: disjoint ranges
SPLIT_SEED_OFFSET = {split: k * SEEDS_PER_SPLIT for k, split in enumerate(SPLITS)}
# ALFRED's unseen validation scenes (kitchen, living room, bedroom, bathroom): eval_out only
HELD_OUT_FLOOR_PLANS = ("FloorPlan10", "FloorPlan219", "FloorPlan308", "FloorPlan424")

# The planner replans after every step off the expert's path, and its time grows steeply with
# receptacles and objects (a FloorPlan1 kitchen with 24 receptacles and 42 objects: ~1 s a plan;
# with 15 and 20: ~0.06 s). Games keep a sample of the floor plan: kitchens list up to 20 cabinets.
MAX_PER_RECEPTACLE_TYPE = 4
MAX_DISTRACTOR_TYPES = 10  # object types besides the target, each with one or two instances
MAX_ATTEMPTS = 20

# the appliance each task type uses, which is never the target receptacle nor the object's start
_APPLIANCE = {
    "pick_clean_then_place": "SinkBasin",
    "pick_heat_then_place": "Microwave",
    "pick_cool_then_place": "Fridge",
}
_OBJECT_PROPERTY = {
    "pick_clean_then_place": "Cleanable",
    "pick_heat_then_place": "Heatable",
    "pick_cool_then_place": "Coolable",
}
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "CounterTop", "TVStand")
# layouts name the THOR object that holds the basin; ALFWorld's receptacle is the basin
_BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
# receptacle types the domain's actions name; the problem must declare them
_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")
_ROOMS = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331), "Bathroom": range(401, 431)}


@dataclass(frozen=True)
class FloorPlan:
    """What a floor plan offers: receptacles (type -> count), movable object types, lamp types."""

    name: str
    room: str
    receptacles: dict[str, int]
    objects: tuple[str, ...]
    lamps: tuple[str, ...]

    def holders(self, object_type: str) -> list[str]:
        """Receptacle types of this floor plan that may hold ``object_type``."""
        from alfworld.gen import constants

        return [r for r in self.receptacles if object_type in constants.VAL_RECEPTACLE_OBJECTS[r]]


@dataclass(frozen=True)
class TaskSpec:
    """One task: its type and targets, in ALFWorld's ``pddl_params`` vocabulary."""

    task_type: str  # short name, a key of TASK_TYPES
    floor_plan: str
    object_target: str
    parent_target: str = ""  # "" for look_at_obj_in_light
    toggle_target: str = ""  # the lamp, look_at_obj_in_light only

    def traj_data(self) -> dict[str, Any]:
        return {
            "task_type": TASK_TYPES[self.task_type],
            "pddl_params": {
                "object_target": self.object_target,
                "parent_target": self.parent_target,
                "toggle_target": self.toggle_target,
                "mrecep_target": "",
                "object_sliced": False,
            },
        }


@dataclass(frozen=True)
class GeneratedGame:
    """A game before the planner has seen it: the ``game.tw-pddl`` fields and ``traj_data.json``."""

    spec: TaskSpec
    game: dict[str, Any]
    traj_data: dict[str, Any]
    receptacles: list[tuple[str, str]]  # (PDDL id, type)
    objects: list[tuple[str, str, str]]  # (PDDL id, type, id of the receptacle it starts in)


def _alfworld_root() -> Path:
    import alfworld

    return Path(alfworld.__file__).parent


@functools.cache
def load_floor_plans() -> dict[str, FloorPlan]:
    """Every floor plan the wheel ships, read from its layout files."""
    from alfworld.gen import constants

    layouts = _alfworld_root() / "gen" / "layouts"
    static = set(constants.VAL_RECEPTACLE_OBJECTS) - constants.MOVABLE_RECEPTACLES_SET
    movable = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values()) & set(constants.OBJECTS)
    plans = {}
    for path in sorted(layouts.glob("FloorPlan*-objects.json")):
        name = path.name.split("-")[0]
        number = int(name.removeprefix("FloorPlan"))
        room = next((room for room, numbers in _ROOMS.items() if number in numbers), None)
        if room is None:
            continue
        types = json.loads(path.read_text())
        counts: dict[str, int] = {}
        openable = path.with_name(f"{name}-openable.json")
        for object_id in json.loads(openable.read_text()) if openable.exists() else []:
            kind = object_id.split("|")[0]
            kind = _BASINS.get(kind, kind)
            if kind in static:
                counts[kind] = counts.get(kind, 0) + 1
        for kind in types:
            kind = _BASINS.get(kind, kind)
            if kind in static and kind not in counts:
                counts[kind] = 1
        receptacles = {kind: min(n, MAX_PER_RECEPTACLE_TYPE) for kind, n in sorted(counts.items())}
        objects = tuple(sorted({t for t in types if t in movable and any(
            t in constants.VAL_RECEPTACLE_OBJECTS[r] for r in receptacles)}))
        lamps = tuple(t for t in _LAMPS if t in types and any(h in receptacles for h in _LAMP_HOSTS))
        plans[name] = FloorPlan(name, room, receptacles, objects, lamps)
    return plans


def _candidates(plan: FloorPlan, task_type: str) -> list[tuple[str, str]]:
    """(object type, target type) pairs this floor plan admits for the task; the target is a lamp
    for look_at_obj_in_light, a receptacle type otherwise."""
    from alfworld.gen import constants

    if plan.room not in constants.GOALS_VALID[TASK_TYPES[task_type]]:
        return []
    if task_type == "look_at_obj_in_light":
        return [(obj, lamp) for lamp in plan.lamps for obj in plan.objects]
    appliance = _APPLIANCE.get(task_type)
    if appliance and appliance not in plan.receptacles:
        return []
    prop = _OBJECT_PROPERTY.get(task_type)
    pairs = []
    for obj in plan.objects:
        if prop and obj not in constants.VAL_ACTION_OBJECTS[prop]:
            continue
        holders = plan.holders(obj)
        for target in holders:
            # the object must be able to start somewhere that is neither the target nor the appliance
            if target != appliance and any(h not in (target, appliance) for h in holders):
                pairs.append((obj, target))
    return pairs


def normalize_split(split: str) -> str:
    """Our name of a split: ``eval`` and the official ``valid_seen`` are ``eval_in``, the official
    ``valid_unseen`` is ``eval_out``; other names are returned as given."""
    return SPLIT_ALIASES.get(split, split)


def floor_plans(split: str, task_type: str) -> list[str]:
    """The floor plans games of this split and task type are drawn from (sorted by number)."""
    split = normalize_split(split)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {[*SPLITS, *SPLIT_ALIASES]}, got {split!r}.")
    plans = load_floor_plans()
    names = [n for n in plans if (n in HELD_OUT_FLOOR_PLANS) == (split == "eval_out")]
    names = [n for n in names if _candidates(plans[n], task_type)]
    return sorted(names, key=lambda n: int(n.removeprefix("FloorPlan")))


def generation_seed(split: str, index: int) -> int:
    return SPLIT_SEED_OFFSET[normalize_split(split)] + index


@contextlib.contextmanager
def _global_random(seed: int) -> Iterator[None]:
    # alfworld picks the task sentence's template with the module-level random; seed it for the
    # call and give the caller's random state back afterwards
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def _pddl_name(kind: str, number: int) -> str:
    if kind in _BASINS.values():
        # "Sink_bar_1_bar_SinkBasin" reads "sinkbasin 1" through ALFWorld's demangler, as THOR's
        # ids do; "SinkBasin_bar_1" would read "sinkbasinbasin 1"
        return f"{kind.removesuffix('Basin')}_bar_{number}_bar_{kind}"
    return f"{kind}_bar_{number}"


def sample_game(split: str, task_type: str, index: int, attempt: int = 0) -> GeneratedGame:
    """Draw game ``index`` of this split and task type (before the planner checks it)."""
    from alfworld.agents.utils.misc import add_task_to_grammar

    seed = generation_seed(split, index)
    rng = random.Random(f"alfworld/{GENERATOR_VERSION}/{task_type}/{seed}/{attempt}")
    plans = load_floor_plans()
    plan = plans[rng.choice(floor_plans(split, task_type))]
    object_target, target = rng.choice(_candidates(plan, task_type))
    look = task_type == "look_at_obj_in_light"
    spec = TaskSpec(task_type, plan.name, object_target,
                    parent_target="" if look else target, toggle_target=target if look else "")

    receptacles = [(_pddl_name(kind, k), kind) for kind, n in plan.receptacles.items() for k in range(1, n + 1)]
    # where each object type may start: ALFRED's filters keep the task from being won at the start
    forbidden = {spec.parent_target, _APPLIANCE.get(task_type, "")}
    others = [kind for kind in plan.objects if kind != object_target]
    kept = {object_target, *rng.sample(others, min(MAX_DISTRACTOR_TYPES, len(others)))}
    objects: list[tuple[str, str, str]] = []
    for kind in (kind for kind in plan.objects if kind in kept):
        if kind == object_target:
            count = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
            allowed = [r for r in receptacles if r[1] in plan.holders(kind) and r[1] not in forbidden]
        else:
            count = rng.randint(1, 2)
            allowed = [r for r in receptacles if r[1] in plan.holders(kind)]
        for k in range(1, count + 1):
            objects.append((_pddl_name(kind, k), kind, rng.choice(allowed)[0]))
    hosts = [r for r in receptacles if r[1] in _LAMP_HOSTS]
    for lamp in plan.lamps:
        objects.append((_pddl_name(lamp, 1), lamp, rng.choice(hosts)[0]))

    problem = _problem_text(f"{plan.name}_{task_type}_{seed}_{attempt}", receptacles, objects, spec)
    traj_data = spec.traj_data()
    root = _alfworld_root() / "data"
    with _global_random(rng.randrange(2**32)):
        grammar = add_task_to_grammar((root / "alfred.twl2").read_text(), traj_data)
    traj_data["scene"] = {"floor_plan": plan.name, "scene_num": int(plan.name.removeprefix("FloorPlan"))}
    traj_data["agentkit"] = {"generator": GENERATOR_VERSION, "split": normalize_split(split), "task": task_type,
                             "index": index, "seed": seed, "attempt": attempt}
    game = {"pddl_domain": (root / "alfred.pddl").read_text(), "grammar": grammar, "pddl_problem": problem}
    return GeneratedGame(spec, game, traj_data, receptacles, objects)


def _problem_text(name: str, receptacles: list[tuple[str, str]], objects: list[tuple[str, str, str]], spec: TaskSpec) -> str:
    from alfworld.gen import constants, goal_library

    object_types = sorted({kind for _, kind, _ in objects} | set(_DOMAIN_OTYPES))
    receptacle_types = sorted({kind for _, kind in receptacles} | set(_DOMAIN_RTYPES))
    location = {rid: f"loc_bar_{k}" for k, (rid, _) in enumerate(receptacles, start=1)}
    declarations = ["agent1 - agent"]
    declarations += [f"{t}Type - otype" for t in object_types]
    declarations += [f"{t}Type - rtype" for t in receptacle_types]
    declarations += [f"{oid} - object" for oid, _, _ in objects]
    declarations += [f"{rid} - receptacle" for rid, _ in receptacles]
    declarations += ["loc_bar_0 - location"] + [f"{loc} - location" for loc in location.values()]

    facts = ["(atLocation agent1 loc_bar_0)"]  # a spot with no receptacle: "the middle of a room"
    for rid, kind in receptacles:
        facts += [f"(receptacleType {rid} {kind}Type)", f"(receptacleAtLocation {rid} {location[rid]})"]
        if kind in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {rid})")
    properties = [("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"), ("Sliceable", "sliceable")]
    for oid, kind, rid in objects:
        facts += [f"(objectType {oid} {kind}Type)", f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {location[rid]})"]
        if kind in _LAMPS:
            facts.append(f"(toggleable {oid})")
            continue
        facts.append(f"(pickupable {oid})")
        facts += [f"({predicate} {oid})" for prop, predicate in properties if kind in constants.VAL_ACTION_OBJECTS[prop]]
    for rtype in sorted({kind for _, kind in receptacles}):
        facts += [f"(canContain {rtype}Type {otype}Type)" for otype in object_types
                  if otype in constants.VAL_RECEPTACLE_OBJECTS[rtype]]

    goal = goal_library.gdict[TASK_TYPES[spec.task_type]]["pddl"].format(
        obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep="")
    # the library writes "?x # type" (ALFRED escapes '-') and its last parenthesis closes the problem
    goal = textwrap.dedent(goal.replace("#", "-")).strip("\n")
    body = "\n  ".join(declarations)
    init = "\n  ".join(facts)
    return f"(define (problem {name})\n (:domain alfred)\n (:objects\n  {body}\n )\n (:init\n  {init}\n )\n{goal}\n"


Solver = Callable[[dict[str, Any]], list[str]]


def game_folder(split: str, task_type: str, index: int, root: Path | None = None) -> Path:
    """Where game ``index`` of this split and task type lives in the cache."""
    base = root or cache_dir() / "alfworld"
    return base / GENERATOR_VERSION / normalize_split(split) / task_type / str(index)


def is_generated(folder: Path) -> bool:
    return (folder / "game.tw-pddl").exists() and (folder / "traj_data.json").exists()


_announced: set[Path] = set()  # the split folders this process has said it generates games into


def announce_generation(split: str, root: Path | None, count: int | None) -> None:
    """Say on stderr, once per process and split folder, that games are being generated and where."""
    folder = game_folder(split, next(iter(TASK_TYPES)), 0, root).parent.parent
    if folder in _announced:
        return
    _announced.add(folder)
    what = f"{count} ALFWorld games" if count is not None else "ALFWorld games"
    print(f"generating {what} for split {normalize_split(split)} on first use (the planner solves each, about a "
          f"second apiece); cached under {folder}", file=sys.stderr, flush=True)


def generate_game(split: str, task_type: str, index: int, solve: Solver, root: Path | None = None) -> Path:
    """Generate (once) game ``index`` and return its ``game.tw-pddl``.

    ``solve`` takes the game's fields and returns the planner's plan, or [] when it finds none or
    the game is already won. The first attempt it solves is written, with the plan as walkthrough,
    into a temporary folder renamed into place (another process may win the race: its game is
    the same).
    """
    if task_type not in TASK_TYPES:
        raise ConfigError(f"Unknown ALFWorld task type {task_type!r}; expected one of {list(TASK_TYPES)}.")
    folder = game_folder(split, task_type, index, root)
    game_file = folder / "game.tw-pddl"
    if is_generated(folder):
        return game_file
    announce_generation(split, root, None)
    for attempt in range(MAX_ATTEMPTS):
        generated = sample_game(split, task_type, index, attempt)
        plan = solve(generated.game)
        if plan:
            break
    else:
        raise EnvError(
            f"No solvable ALFWorld game for split {split!r}, task type {task_type!r}, index {index} "
            f"after {MAX_ATTEMPTS} attempts; try another seed."
        )
    game = {**generated.game, "solvable": True, "walkthrough": plan}
    with build_folder_once(folder, game_file.name) as tmp:
        (tmp / "game.tw-pddl").write_text(json.dumps(game, sort_keys=True, indent=1))
        (tmp / "traj_data.json").write_text(json.dumps(generated.traj_data, sort_keys=True, indent=1))
    return game_file

