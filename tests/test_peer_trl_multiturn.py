"""benchmarks/peer_trl_multiturn.py: TRL's side sees agentkit's tokens, and a tiny run prints its table (slow)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (pip install -c constraints.txt trl)"),
    pytest.mark.skipif(importlib.util.find_spec("textworld") is None, reason="needs the textworld extra"),
]

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def peer(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports peer_trl from its own folder
    spec = importlib.util.spec_from_file_location("peer_trl_multiturn", BENCHMARKS / "peer_trl_multiturn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_side_prompts_and_turns_are_agentkit_tokens(peer):
    from agentkit.rollout.context import ChatContext
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    ours = AutoTokenizer.from_pretrained(str(model_dir))
    theirs = AutoTokenizer.from_pretrained(str(model_dir))
    theirs.chat_template, theirs.response_template = peer.TOOL_CHAT_TEMPLATE, peer.ACT_RESPONSE_TEMPLATE
    assert supports_tool_calling(theirs) and is_chat_template_prefix_preserving(theirs)  # TRL keeps our template
    system, observation, reply = peer.action_format().instruction, "-= Kitchen =-\nA fridge.", "You can't go that way."
    context = ChatContext(ours, system)
    first = theirs.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": observation}],
                                       add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert list(first) == context.first(observation)
    answer = ours("go north<|im_end|>", add_special_tokens=False)["input_ids"]
    parsed = parse_response(theirs, answer, prefix=first)
    assert peer.answer_text(parsed) == "go north"  # every answer is one call of act()
    # what TRL's tool loop appends after an answer: exactly agentkit's next-turn tokens
    trainer = SimpleNamespace(processing_class=theirs, chat_template=None, _is_vlm=False, _tokenizer=theirs,
                              chat_template_kwargs={})
    suffix = GRPOTrainer._get_tool_suffix_ids(trainer, [{"role": "tool", "name": "act", "content": reply}])
    assert list(suffix) == context.next(answer, reply)


def test_tiny_run_prints_both_trl_configurations():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "peer_trl_multiturn.py"), "--turns", "2", "--rounds", "1",
                           "--steps", "1", "--warmup", "1", "--tasks-per-step", "1", "--group-size", "2",
                           "--max-tokens-per-turn", "4", "--quiet-wait", "0"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "agentkit / TRL expert" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 2 |"))
    assert row.count("x**") == 2  # both ratios
    assert "tokens/episode" in done.stdout


def test_neither_side_runs_a_reference_model(peer, tmp_path):
    """The workload has no KL (TRL's beta 0): agentkit's GRPO, whose default kl_coef loads a frozen
    reference and runs it every step, must not pay for one in either peer."""
    import peer_trl  # the single-turn peer, from the same folder

    peer.register_env()
    args = SimpleNamespace(seed=0, tasks_per_step=2, group_size=8, max_tokens_per_turn=16, show_admissible=False,
                           env_workers=0, warmup=1, steps=2, prompts_per_step=4, max_completion=32)
    for cfg in (peer.agentkit_config(args, tmp_path, tmp_path, 4), peer_trl.agentkit_config(args, tmp_path, tmp_path)):
        assert cfg.objective.name == "grpo" and not cfg.objective.requirements().needs_reference
    assert peer_trl.trl_grpo_config(out=tmp_path, config="defaults", seed=0, steps=1, samples=8, group_size=8,
                                    max_completion=8).beta == 0.0
