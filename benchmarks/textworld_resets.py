"""TextWorld resets: agentkit's environment against ``textworld.start`` as it was called before.

Until 2026-12-07 ``TextWorldEnv`` started a new ``textworld.start`` environment whenever an episode
played another game than its last one, and reset it: each such reset read the game's ``.json`` file,
loaded a Z-machine, and searched the game's quests for the winning policy again. Now each game's
opening (the game read once, the opening's quest progression and winning policy) is kept per process
and copied, and an environment keeps its Z-machine from one game to the next. Three patterns, the
same games and environments on both sides, milliseconds per reset (median of ``--rounds``):

- ``new game``: every reset plays a game this process has not played (no opening to reuse);
- ``GRPO groups``: ``--envs`` environments, ``--group`` of them on each game, a new set of games each
  round of resets (a GRPO step's layout: the group's first reset reads the game, the others copy it);
- ``same game``: one environment resetting the game it just played.

    python benchmarks/textworld_resets.py
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def old_reset(state: dict, game_file, infos):
    """What ``TextWorldEnv.reset`` did before: a new environment whenever the game changes, then reset."""
    import textworld

    if state.get("file") != game_file:
        if state.get("env") is not None:
            state["env"].close()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            state["env"] = textworld.start(str(game_file), request_infos=infos)
        state["file"] = game_file
    return state["env"].reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--challenge", default="tw-simple")
    parser.add_argument("--envs", type=int, default=16, help="Environments in the GRPO pattern.")
    parser.add_argument("--group", type=int, default=8, help="Environments on each game (GRPO group size).")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from agentkit.envs.textworld_env import TextWorldEnv, game_path

    games_per_round = args.envs // args.group
    base = 500_000  # task seeds no other benchmark uses, so no opening is kept from elsewhere
    seeds = range(base, base + 2 * args.rounds * max(games_per_round, args.envs))
    TextWorldEnv(args.challenge).prepare(seeds)
    infos = TextWorldEnv(args.challenge)._infos()

    def path(seed):
        return game_path(args.challenge, "train", seed, {})

    def timed(reset, pairs) -> float:
        """Milliseconds per ``reset(env, seed)`` over ``pairs`` of (environment, seed)."""
        start = time.perf_counter()
        for env, seed in pairs:
            reset(env, seed)
        return (time.perf_counter() - start) / len(pairs) * 1000

    def before(state, seed):
        return old_reset(state, path(seed), infos)

    def now(env, seed):
        return env.reset(seed=seed)

    fresh = iter(seeds)
    rows = {"new game": ([], []), "GRPO groups": ([], []), "same game": ([], [])}
    for _ in range(args.rounds):  # new game: one environment, a new game at every reset, on each side
        state, env = {}, TextWorldEnv(args.challenge)
        rows["new game"][0].append(timed(before, [(state, next(fresh)) for _ in range(8)]))
        rows["new game"][1].append(timed(now, [(env, next(fresh)) for _ in range(8)]))
        state["env"].close()
        env.close()
    old_states = [{} for _ in range(args.envs)]
    envs = [TextWorldEnv(args.challenge) for _ in range(args.envs)]
    for _ in range(args.rounds):  # GRPO groups: the same layout on both sides, new games every round
        for side, (reset, players) in enumerate(((before, old_states), (now, envs))):
            games = [next(fresh) for _ in range(games_per_round)]
            last = [games[i // args.group] for i in range(args.envs)]
            rows["GRPO groups"][side].append(timed(reset, list(zip(players, last, strict=True))))
    for _ in range(args.rounds):  # same game: the GRPO pattern's environments replay their last game
        rows["same game"][0].append(timed(lambda state, _: old_reset(state, state["file"], infos),
                                          [(state, None) for state in old_states]))
        rows["same game"][1].append(timed(now, list(zip(envs, last, strict=True))))

    print(f"\n{args.challenge}, {args.rounds} rounds, GRPO pattern: {args.envs} environments, groups of {args.group}\n")
    print("| resets | textworld.start (before) ms | agentkit ms | before / now |")
    print("| --- | --- | --- | --- |")
    for name, (old, ours) in rows.items():
        a, b = statistics.median(old), statistics.median(ours)
        print(f"| {name} | {a:.1f} | {b:.1f} | **{a / b:.2f}x** |")


if __name__ == "__main__":
    main()
