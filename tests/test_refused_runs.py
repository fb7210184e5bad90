"""What a rollout refuses and what it leaves behind: a huge --episodes streams through a bounded
number of episodes in flight, an --out that is no regular file is one clear line, and a run refused
before its first episode leaves no file it created."""

from __future__ import annotations

import functools
import itertools

import pytest
from agentkit.envs import make
from fault_server import FaultServer

from agentkit.cli import main

VAULTS = ["--env", "vaults/vaults-v0", "--max-turns", "2", "--max-new-tokens", "8", "--quiet"]


class _Stop(Exception):
    pass


def test_a_huge_episode_count_streams_through_a_bounded_number_in_flight(backend):
    from agentkit.rollout import EpisodeSpec
    from agentkit.rollout.collector import AUTO_IN_FLIGHT
    from agentkit.rollout.run import RolloutConfig, episode_specs, make_collector, sampling_params
    from agentkit.rollout.runners import make_env_runner

    from agentkit.core.settings import ContextSettings, EnvSettings

    specs = episode_specs(RolloutConfig(episodes=10**12, group_size=1))
    assert next(specs) == EpisodeSpec(seed=0, sample=0)  # made as read: no list of a trillion episodes
    drawn = itertools.count()

    def endless():
        for seed in range(100_000):  # long, not endless: an eager collector fails here instead of hanging
            next(drawn)
            yield EpisodeSpec(seed=seed)

    def stop_at_first(trajectory):
        raise _Stop

    envs = make_env_runner(functools.partial(make, "vaults/vaults-v0", max_turns=2), 0)
    collector = make_collector(backend, envs, env=EnvSettings(id="vaults/vaults-v0"), split="train",
                               sampling=sampling_params(RolloutConfig().sampling, 0), context=ContextSettings())
    with pytest.raises(_Stop):
        collector.run(endless(), stop_at_first)  # max_in_flight 0 on an endless stream: AUTO_IN_FLIGHT at a time
    collector.close()
    assert next(drawn) == AUTO_IN_FLIGHT + 1  # the slots filled, and the next episode read ahead


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_an_out_that_is_no_regular_file_is_one_line(tmp_path, capsys, tiny_model_dir, target):
    import os

    out = tmp_path / "fifo" if target == "fifo" else target
    if target == "fifo":
        os.mkfifo(out)
    code = main(["rollout", *VAULTS, "--model", str(tiny_model_dir), "--episodes", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"--out {out} is not a regular file" in err and "Traceback" not in err, err


def test_a_run_refused_by_the_server_leaves_no_file_it_created(tmp_path, capsys, tiny_model_dir):
    """The server answers far more than max_new_tokens (a refusal, exit 2): the new file goes; an
    existing file given with --append stays as it was."""
    out = tmp_path / "rollout.jsonl"
    with FaultServer() as server:
        server.plan([], then="too_many_tokens")
        flags = [*VAULTS, "--model", str(tiny_model_dir), "--backend", "openai", "--base-url", server.url,
                 "--episodes", "1", "--max-retries", "0"]
        code = main(["rollout", *flags, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and "tokens where at most max_new_tokens=8" in err and "Traceback" not in err, err
        assert not out.exists(), "the refused run left the file it created"
        out.write_text("")
        assert main(["rollout", *flags, "--out", str(out), "--append"]) == 2
        assert out.exists() and out.read_text() == ""
