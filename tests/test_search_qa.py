"""Search-QA: the generated corpus, the retrieval backends and the environment, all real.

Retrieval is real (bm25s; Lucene through pyserini in the slow tests), the http backend talks to
real servers on 127.0.0.1: ours, and tiny ones written here that misbehave on purpose.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from agentkit.envs import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError

pytest.importorskip("bm25s", reason="needs the search extra (bm25s)")

from agentkit.envs.search_qa.corpus import (  # noqa: E402
    CORPUS_FILE,
    EVAL_FILE,
    META_FILE,
    TRAIN_FILE,
    generate,
    generated_dir,
    read_qa,
    write_corpus,
)
from agentkit.envs.search_qa.env import (  # noqa: E402
    MAX_QUERY_CHARS,
    SearchQAEnv,
    exact_match,
    normalize_answer,
    parse_action,
    token_f1,
)
from agentkit.envs.search_qa.retrieval import (  # noqa: E402
    BM25sRetriever,
    HttpRetriever,
    Passage,
    RetrievalError,
    Retriever,
    find_java_home,
    index_dir_for,
    lucene_escape,
    lucene_query,
)
from agentkit.envs.search_qa.server import RetrievalServer  # noqa: E402


@pytest.fixture(scope="module")
def corpus_dir(agentkit_cache) -> Path:
    return generated_dir()


@pytest.fixture(scope="module")
def bm25(corpus_dir) -> BM25sRetriever:
    retriever = BM25sRetriever(corpus_dir / CORPUS_FILE)
    yield retriever
    retriever.close()


@pytest.fixture(scope="module")
def eval_env(corpus_dir) -> SearchQAEnv:
    env = SearchQAEnv(split="eval")
    yield env
    env.close()


@pytest.fixture(scope="module")
def server(bm25) -> RetrievalServer:
    with RetrievalServer(bm25) as srv:
        yield srv


def play_expert(env, seed: int) -> tuple[dict, list[str]]:
    """Play the expert plan of task ``seed``; return the last info and the observations seen."""
    _, info = env.reset(seed=seed)
    observations = []
    for action in info["expert_plan"]:
        obs, _, terminated, truncated, info = env.step(action)
        observations.append(obs)
        assert info["action_valid"], action
        if terminated or truncated:
            break
    assert terminated
    return info, observations


def expert_rates(env, seeds) -> dict[str, tuple[int, int, int]]:
    """Per question type: (won, supported, played). Supported: each hop's search showed that hop's
    supporting passage, and the gold answer was in what the searches showed."""
    counts: dict[str, list[int]] = {}
    for seed in seeds:
        item = env.questions[seed]
        info, observations = play_expert(env, seed)
        searches = observations[:-1]
        titles = [f'(Title: "{env._support[pid][0]}")' for pid in item.supporting_ids]
        supported = (
            len(searches) == len(titles)
            and all(title in obs for title, obs in zip(titles, searches, strict=True))
            and any(normalize_answer(g) in normalize_answer(" ".join(searches)) for g in item.golden_answers)
        )
        row = counts.setdefault(item.type, [0, 0, 0])
        row[0] += info["won"]
        row[1] += supported
        row[2] += 1
    return {kind: tuple(row) for kind, row in counts.items()}


# ---------------------------------------------------------------------------------------------
# corpus


def test_corpus_is_deterministic_across_processes(tmp_path):
    write_corpus(tmp_path / "a", seed=5, num_passages=300)
    script = "import sys; from agentkit.envs.search_qa.corpus import write_corpus; write_corpus(sys.argv[1], seed=5, num_passages=300)"
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "b")], check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    for name in (CORPUS_FILE, TRAIN_FILE, EVAL_FILE, META_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    meta = json.loads((tmp_path / "a" / META_FILE).read_text())
    for name in (CORPUS_FILE, TRAIN_FILE, EVAL_FILE):
        assert meta["sha256"][name] == hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest()
    write_corpus(tmp_path / "c", seed=6, num_passages=300)
    assert (tmp_path / "c" / CORPUS_FILE).read_bytes() != (tmp_path / "a" / CORPUS_FILE).read_bytes()
    with pytest.raises(ConfigError, match="already holds"):
        write_corpus(tmp_path / "a", seed=5, num_passages=300)
    write_corpus(tmp_path / "a", seed=5, num_passages=300, overwrite=True)


def test_generated_dir_is_cached_and_complete(corpus_dir):
    assert generated_dir() == corpus_dir
    assert corpus_dir.name == "seed0-n3000-v1"
    corpus = [json.loads(line) for line in (corpus_dir / CORPUS_FILE).read_text().splitlines()]
    assert len(corpus) == 3000 and [list(r) for r in corpus[:1]] == [["id", "title", "contents"]]
    assert all(r["contents"].startswith(f'"{r["title"]}"\n') for r in corpus)
    meta = json.loads((corpus_dir / META_FILE).read_text())
    assert meta["num_passages"] == 3000 and meta["num_questions"]["eval"] > 1000
    with pytest.raises(ConfigError, match="num_passages must be an integer from 100"):
        generated_dir(num_passages=10)
    with pytest.raises(ConfigError, match="non-negative"):
        generated_dir(seed=-1)


def test_splits_are_disjoint_and_reference_the_corpus(corpus_dir):
    ids = {json.loads(line)["id"] for line in (corpus_dir / CORPUS_FILE).read_text().splitlines()}
    train, evals = read_qa(corpus_dir / TRAIN_FILE), read_qa(corpus_dir / EVAL_FILE)
    assert not {q.question for q in train} & {q.question for q in evals}
    assert not {q.id for q in train} & {q.id for q in evals}
    assert len({q.question for q in train}) == len(train)
    for item in train + evals:
        assert set(item.supporting_ids) <= ids
        assert item.type in ("single", "multi") and len(item.hop_queries) == len(item.supporting_ids)
        assert (item.type == "single") == (len(item.supporting_ids) == 1)
    kinds = Counter(q.kind for q in evals)
    assert set(kinds) == {"single", "bridge", "comparison"}
    assert 0.08 < len(evals) / (len(train) + len(evals)) < 0.12


def test_answers_live_only_in_the_corpus(corpus_dir):
    import bm25s.stopwords

    passages = {json.loads(line)["id"]: json.loads(line) for line in (corpus_dir / CORPUS_FILE).read_text().splitlines()}
    stopwords = set(bm25s.stopwords.STOPWORDS_EN)
    for item in read_qa(corpus_dir / EVAL_FILE) + read_qa(corpus_dir / TRAIN_FILE):
        final = passages[item.supporting_ids[-1]]
        if item.kind == "comparison":
            # the answer is one of the two compared names; which one only the passages tell
            assert item.golden_answers[0] in {passages[pid]["title"] for pid in item.supporting_ids}
            continue
        assert item.golden_answers[0] in final["contents"], (item, final)
        assert normalize_answer(item.golden_answers[0]) not in normalize_answer(item.question), item
    # invented names: no name is an English stopword, and another seed invents other names
    titles = {p["title"] for p in passages.values()}
    words = {w.lower() for t in titles for w in t.split() if w[0].isupper()}
    assert not words & stopwords
    other = {r["title"] for r in generate(seed=1, num_passages=3000).corpus}
    assert len(titles & other) / len(titles) < 0.02


# ---------------------------------------------------------------------------------------------
# scoring and parsing


@pytest.mark.parametrize("text, expected", [
    ("The Osra River", "osra river"),
    ("  an   Apple, a day!  ", "apple day"),
    ("12,480", "12480"),
    ("Theatre of the Absurd", "theatre of absurd"),
    ("A", ""),
    ("Müller's café", "müllers café"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_golden_values():
    assert exact_match("the Osra river.", ["Osra River", "Osra"])
    assert exact_match("OSRA", ["Osra River", "Osra"])
    assert not exact_match("Osra stream", ["Osra River"])
    assert exact_match("12480", ["12,480"])
    assert token_f1("Osra River", ["Osra River"]) == 1.0
    assert token_f1("Osra", ["Osra River"]) == pytest.approx(2 * 1 * 0.5 / 1.5)  # p=1, r=1/2
    assert token_f1("the big Osra stream", ["Osra River"]) == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    assert token_f1("nothing", ["Osra River", "nothing at all"]) == pytest.approx(2 * 1 * (1 / 3) / (1 + 1 / 3))
    assert token_f1("Kelvar", ["Mount Kelvar", "Kelvar"]) == 1.0  # the best golden answer counts
    assert token_f1("", ["Osra"]) == 0.0 and token_f1("the", ["a"]) == 1.0  # both empty after normalization
    assert token_f1("osra osra", ["osra"]) == pytest.approx(2 * 0.5 * 1 / 1.5)  # repeated tokens count once


@pytest.mark.parametrize("text, expected", [
    ("<search>where is Osra</search>", ("search", "where is Osra")),
    ("<think>hmm</think>\n<answer> Osra  River </answer>", ("answer", "Osra River")),
    ("<search>a</search> then <answer>b</answer>", ("answer", "b")),
    ("<answer>b</answer> no wait <search>c</search>", ("search", "c")),
    ("<search>first</search><search>second</search>", ("search", "second")),
    ("<search>outer <search>inner</search>", ("search", "inner")),
    ("<answer><search>q</search></answer>", ("answer", "q")),
    ("<search>q</search><answer>unfinished", ("search", "q")),
    ("</search><search>x", None),
    ("<SEARCH>Upper</Search >", ("search", "Upper")),
    ("<search></search>", ("search", "")),
    ("<search>a\n\tb</search>", ("search", "a b")),
    ("just text", None),
    ("<action>go north</action>", None),
    ("", None),
    (None, None),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_invalid_actions_are_flagged_and_the_episode_goes_on(eval_env):
    env = eval_env
    env.reset(seed=0)
    for bad, reason in [("no tags at all", "no complete"), ("<search> </search>", "empty"), ("<answer></answer>", "empty"),
                        ("<search>" + "x " * MAX_QUERY_CHARS + "</search>", "longer than"), ("<action>look</action>", "no complete")]:
        obs, reward, terminated, truncated, info = env.step(bad)
        assert not info["action_valid"] and reward == 0 and not terminated and not truncated
        assert reason in obs and "<search>" in obs and "<answer>" in obs
    assert info["searches"] == 0


def test_search_limit_and_answer_end_the_episode(corpus_dir):
    env = SearchQAEnv(split="eval", max_searches=1, top_k=2)
    try:
        _, info = env.reset(seed=0)
        obs, _, _, _, info = env.step("<search>which river flows past the town</search>")
        assert info["action_valid"] and obs.startswith("<information>Doc 1(Title: ") and "Doc 3" not in obs
        assert len(info["retrieved_ids"]) <= 2
        obs, _, terminated, _, info = env.step("<search>again</search>")
        assert not info["action_valid"] and "limit (1)" in obs and not terminated
        assert info["expert_plan"] == [f"<answer>{env.questions[0].golden_answers[0]}</answer>"]
        obs, reward, terminated, _, info = env.step("I think <answer>surely wrong</answer>")
        assert terminated and reward == 0.0 and not info["won"] and info["f1"] == 0.0
        with pytest.raises(EnvError, match="after the episode ended"):
            env.step("<answer>x</answer>")
        with pytest.raises(ConfigError, match="run from 0 to"):
            env.reset(seed=env.num_tasks)
    finally:
        env.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(
    ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<SEARCH >", "</answer >", "\x00", "\ud800", "\n"])),
    max_size=12).map("".join))
def test_step_never_raises_on_model_text(eval_env, text):
    eval_env.reset(seed=3)
    obs, reward, terminated, truncated, info = eval_env.step(text)
    assert isinstance(obs, str) and reward in (0.0, 1.0) and isinstance(info["action_valid"], bool)
    assert terminated == (parse_action(text) is not None and parse_action(text)[0] == "answer" and info["action_valid"])


# ---------------------------------------------------------------------------------------------
# the environment with bm25s


@pytest.mark.parametrize("split", ["train", "eval"])
def test_check_env(split, corpus_dir):
    env = SearchQAEnv(split=split)
    try:
        check_env(env, seed=0)
        check_env(env, seed=env.num_tasks - 1)
    finally:
        env.close()


def test_expert_plans_win_with_bm25s(eval_env):
    rates = expert_rates(eval_env, range(eval_env.num_tasks))
    print("\nbm25s expert (won, retrieved support, played):", rates)
    for kind, (won, supported, played) in rates.items():
        assert played > 50
        assert won == played, kind
        assert supported == played, kind  # every hop's search retrieved its passage with k=3


def test_observations_info_and_expert_plan_follow_the_state(eval_env):
    seed = next(i for i, q in enumerate(eval_env.questions) if q.kind == "bridge")
    item = eval_env.questions[seed]
    obs, info = eval_env.reset(seed=seed)
    assert item.question in obs and "<search>" in obs and "<answer>" in obs
    assert info["task"] == item.question and info["admissible_actions"] is None and info["f1"] is None
    assert info["privileged"].startswith("Gold answer: " + item.golden_answers[0])
    assert all(eval_env._support[pid][1] in info["privileged"] for pid in item.supporting_ids)
    plan = info["expert_plan"]
    assert plan == [f"<search>{q}</search>" for q in item.hop_queries] + [f"<answer>{item.golden_answers[0]}</answer>"]
    obs, _, _, _, info = eval_env.step(f"<think>first hop</think>{plan[0]}")
    assert item.supporting_ids[0] in info["retrieved_ids"] and info["expert_plan"] == plan[1:]
    obs, _, _, _, info = eval_env.step(plan[1])
    assert info["expert_plan"] == plan[2:] and info["searches"] == 2
    obs, reward, terminated, _, info = eval_env.step(f"So the answer is <answer>the {item.golden_answers[0]}.</answer>")
    assert reward == 1.0 and terminated and info["won"] and info["f1"] == 1.0 and info["score"] == 1.0
    assert info["expert_plan"] == []


def test_made_through_the_registry_escape_hatch_with_wrappers(corpus_dir):
    from agentkit.envs import make

    env = make("agentkit.envs.search_qa.env:SearchQAEnv", split="eval", max_turns=3)
    try:
        assert type(env.unwrapped) is SearchQAEnv
        check_env(env)
        info, _ = play_expert(env, 7)
        assert info["won"]
        env.reset(seed=7)
        for _ in range(3):
            _, _, terminated, truncated, info = env.step("<search>still looking</search>")
        assert truncated and not terminated and not info["won"]
    finally:
        env.close()


def test_rollouts_use_the_search_answer_format_and_stop_at_answer(tiny_model_dir, corpus_dir):
    """The policy is prompted with Search-QA's own format (not <action>), and generation stops at
    </answer>: the tiny model, taught to write the answer and then keep talking, is cut there."""
    import torch
    from agentkit.envs import SEARCH_ANSWER, ParseAction, Wrapper, env_info, make
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.context import encode_data, format_observation, make_context
    from agentkit.rollout.hf_backend import HFBackend

    env_id = "search-qa/generated-v0"
    fmt = env_info(env_id).action_format
    assert fmt is SEARCH_ANSWER and fmt.parser is None and fmt.stop == ("</search>", "</answer>")
    assert "<search>" in fmt.instruction and "<answer>" in fmt.instruction and "<action>" not in fmt.instruction
    make_env = functools.partial(make, env_id, split="eval", action_parser="format", max_turns=2)
    env = make_env()
    obs, info = env.reset(seed=0)
    env.close()
    layers, layer = [], env
    while isinstance(layer, Wrapper):
        layers.append(type(layer))
        layer = layer.env
    assert ParseAction not in layers and type(layer) is SearchQAEnv, "the environment reads the whole response"
    backend = HFBackend(tiny_model_dir, seed=0)  # its own copy of the weights, taught below
    tok, model = backend.tokenizer, backend.model
    builder = make_context("chat", tok, fmt.instruction)
    prompt = builder.next_turn(builder.start(info["task"]), format_observation(obs, info, show_admissible=True, first=True))
    target = encode_data(tok, info["expert_plan"][-1] + " and some more words after it")
    ids = torch.tensor([prompt + target])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(150):
        logits = model(ids).logits[0, len(prompt) - 1:-1]  # [T, V]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    free = backend.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=len(target), stop=()))[0]
    assert tok.decode(free.token_ids, skip_special_tokens=True).startswith(info["expert_plan"][-1] + " and some")

    written = []
    Collector(backend, make_env, env_id=env_id, split="eval",
              sampling=SamplingParams(temperature=0.0, max_new_tokens=len(target))).run([EpisodeSpec(0)], written.append)
    trajectory, = written
    turn = trajectory.turns[0]
    assert turn.context_ids == prompt and "<action>" not in tok.decode(turn.context_ids)
    assert turn.response_text == info["expert_plan"][-1] and turn.finish_reason == "stop"
    assert trajectory.won and trajectory.terminated and trajectory.sampling["stop"] == ["</search>", "</answer>"]


def _play_in_fresh_process(kwargs: dict, seeds: list[int]) -> list[bool]:
    env = SearchQAEnv(**kwargs)
    try:
        return [play_expert(env, s)[0]["won"] for s in seeds]
    finally:
        env.close()


def test_env_builds_from_kwargs_in_a_spawned_process(corpus_dir):
    kwargs = {"split": "eval", "retriever": "bm25s", "top_k": 3, "max_searches": 4, "corpus_seed": 0, "num_passages": 3000}
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(functools.partial(_play_in_fresh_process, kwargs, [0, 1, 2, 3])) == [True] * 4


def test_first_use_from_several_processes_at_once(tmp_path, monkeypatch):
    # a fresh cache: three workers generate the corpus and build the index concurrently
    monkeypatch.setenv("AGENTKIT_CACHE", str(tmp_path / "cache"))
    kwargs = {"split": "train", "num_passages": 400}
    with mp.get_context("spawn").Pool(3) as pool:
        results = [pool.apply_async(_play_in_fresh_process, (kwargs, [i, i + 3])) for i in range(3)]
        assert [r.get(timeout=120) for r in results] == [[True, True]] * 3
    folder = tmp_path / "cache" / "search_qa" / "seed0-n400-v1"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["seed0-n400-v1"]  # no temporary folders left
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.jsonl", "corpus.jsonl.bm25s", "eval.jsonl", "meta.json", "train.jsonl"]


def test_close_releases_and_refuses_further_use(corpus_dir):
    env = SearchQAEnv(split="eval")
    env.reset(seed=0)
    env.close()
    env.close()  # idempotent
    assert env.retriever is None
    with pytest.raises(EnvError, match="close"):
        env.step("<search>x</search>")
    with pytest.raises(EnvError, match="close"):
        env.reset(seed=0)
    retriever = BM25sRetriever(corpus_dir / CORPUS_FILE)
    server = RetrievalServer(retriever, own_retriever=True).start()
    client = HttpRetriever(server.url, retries=0)
    assert client.search(["Osra"], 1) is not None
    server.close()  # stops serving, frees the port and closes the retriever it owns
    with pytest.raises(RetrievalError, match="failed 1 time"):
        client.search(["Osra"], 1)
    client.close()
    for closed in (retriever, client):
        with pytest.raises(RetrievalError, match="after close"):
            closed.search(["Osra"], 1)


def test_constructor_errors(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'bm25s'"):
        SearchQAEnv(retriever="bm25")
    with pytest.raises(ConfigError, match="split must be"):
        SearchQAEnv(split="test")
    with pytest.raises(ConfigError, match="needs retriever_url"):
        SearchQAEnv(retriever="http")
    with pytest.raises(ConfigError, match="top_k"):
        SearchQAEnv(top_k=0)
    with pytest.raises(ConfigError, match="No such file"):
        SearchQAEnv(corpus=tmp_path / "missing.jsonl")
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "q?"}\n')
    with pytest.raises(ConfigError, match="golden_answers"):
        SearchQAEnv(qa=bad)


def test_user_corpus_and_qa_files(tmp_path):
    folder = write_corpus(tmp_path / "mine", seed=2, num_passages=200)
    env = SearchQAEnv(split="train", corpus=folder, qa=folder)  # folders: corpus.jsonl and train.jsonl
    try:
        assert env.corpus_path == folder / CORPUS_FILE and env.qa_path == folder / TRAIN_FILE
        info, _ = play_expert(env, 0)
        assert info["won"]
        assert not (folder / f"{CORPUS_FILE}.bm25s").exists()  # the user's folder is left alone
        assert (index_dir_for(folder / CORPUS_FILE, "bm25s") / "agentkit-index.json").is_file()  # in the cache
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# retrieval backends


def test_bm25s_retriever(bm25, corpus_dir):
    assert isinstance(bm25, Retriever)
    item = read_qa(corpus_dir / EVAL_FILE)[0]
    [hits] = bm25.search([item.hop_queries[0]], 5)
    assert len(hits) == 5 and hits[0].id == item.supporting_ids[0]
    assert all(isinstance(p, Passage) and p.score > 0 for p in hits)
    assert [p.score for p in hits] == sorted((p.score for p in hits), reverse=True)
    assert bm25.search(["the of and", ""], 3) == [[], []]  # nothing searchable: no passages
    assert bm25.search([], 3) == []
    with pytest.raises(ConfigError, match="k"):
        bm25.search(["x"], 0)
    with pytest.raises(ConfigError, match="list of strings"):
        bm25.search("a bare string", 3)


def test_bm25s_index_is_built_once(corpus_dir):
    marker = corpus_dir / f"{CORPUS_FILE}.bm25s" / "agentkit-index.json"
    before = marker.stat().st_mtime_ns
    BM25sRetriever(corpus_dir / CORPUS_FILE).close()
    assert marker.stat().st_mtime_ns == before


def test_http_backend_matches_the_embedded_index(server, bm25, corpus_dir):
    client = HttpRetriever(server.url)
    queries = [q.hop_queries[0] for q in read_qa(corpus_dir / EVAL_FILE)[:40]] + ["", "zzz unknown words"]
    remote, local = client.search(queries, 3), bm25.search(queries, 3)
    assert [[p.id for p in hits] for hits in remote] == [[p.id for p in hits] for hits in local]
    assert [[p.title for p in hits] for hits in remote] == [[p.title for p in hits] for hits in local]
    assert [[p.text for p in hits] for hits in remote] == [[p.text for p in hits] for hits in local]
    assert [p.score for hits in remote for p in hits] == pytest.approx([p.score for hits in local for p in hits])
    assert HttpRetriever(server.url + "/retrieve").search(queries[:1], 1)[0][0].id == local[0][0].id
    with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
        assert json.load(r) == {"status": "ok"}


def test_env_over_http_wins_like_the_embedded_one(server):
    env = SearchQAEnv(split="eval", retriever="http", retriever_url=server.url)
    try:
        check_env(env)
        seeds = list(range(50))
        rates = expert_rates(env, seeds)
        assert all(won == supported == played for won, supported, played in rates.values()), rates
    finally:
        env.close()


def test_nq_style_questions_over_a_remote_corpus(server, tmp_path):
    # only question and golden_answers, as in NQ: the plan searches the question, then answers
    qa = tmp_path / "nq.jsonl"
    source = read_qa(generated_dir() / EVAL_FILE)[:3]
    qa.write_text("".join(json.dumps({"question": q.question, "golden_answers": list(q.golden_answers)}) + "\n" for q in source))
    env = SearchQAEnv(split="eval", retriever="http", retriever_url=server.url, eval_qa=qa)
    try:
        assert env.corpus_path is None and env.num_tasks == 3
        _, info = env.reset(seed=numpy_int(1))
        assert info["expert_plan"] == [f"<search>{source[1].question}</search>", f"<answer>{source[1].golden_answers[0]}</answer>"]
        assert info["privileged"] == "Gold answer: " + " | ".join(source[1].golden_answers)  # no passages here
        _, _, _, _, info = env.step(info["expert_plan"][0])
        assert info["expert_plan"] == [f"<answer>{source[1].golden_answers[0]}</answer>"]
    finally:
        env.close()


def numpy_int(value: int):
    import numpy

    return numpy.int64(value)


def test_server_runs_as_a_program(corpus_dir):
    command = [sys.executable, "-m", "agentkit.envs.search_qa.server", "--port", "0", "--topk", "2"]
    # Ctrl-C as a shell delivers it: SIGINT at its default disposition in the server, whatever the
    # test process inherited or set (a child inherits an ignored SIGINT, and Python then keeps ignoring it)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+)/retrieve", line).group(1)
        [hits] = HttpRetriever(url).search(["In which town was anyone born"], 2)
        assert len(hits) == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{proc.pid}/status")
            masks = [line for line in status.read_text().splitlines() if line.startswith("Sig")] if status.exists() else []
            proc.kill()
            pytest.fail(f"the server did not stop within 30 s of SIGINT; its signal masks: {masks}")
        assert code == 0


def test_our_server_rejects_bad_requests(server):
    def post(body: bytes, path: str = "/retrieve") -> tuple[int, dict]:
        request = urllib.request.Request(server.url + path, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)

    assert post(b"not json")[0] == 400
    assert post(b'{"queries": "one string"}')[0] == 400
    assert post(b'{"queries": ["x"], "topk": 100000}')[0] == 400
    assert post(b'{"queries": ["x"]}', "/elsewhere")[0] == 404
    status, payload = post(b'{"queries": ["Osra"], "topk": 2}')  # no return_scores: bare documents
    assert status == 200 and all(set(doc) == {"id", "title", "text", "contents"} for hits in payload["result"] for doc in hits)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "localhost:8000", "//127.0.0.1:8000",
                                 "javascript:alert(1)", "http://", "http://[::1", "", None])
def test_http_backend_refuses_non_http_urls(url):
    with pytest.raises(ConfigError, match="http"):
        HttpRetriever(url)


@contextlib.contextmanager
def misbehaving_server(respond, protocol: str = "HTTP/1.1"):
    """A real server on 127.0.0.1 whose POST handler is ``respond(handler, attempt)``."""
    attempts = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = protocol

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            attempts.append(time.monotonic())
            with contextlib.suppress(OSError):  # the client may hang up on purpose
                respond(self, len(attempts))

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", attempts
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


def reply(handler, status: int, body: bytes, *, length: bool = True, headers: dict | None = None) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


GOOD = json.dumps({"result": [[{"document": {"id": "d1", "contents": '"T"\nbody text'}, "score": 1.5}]]}).encode()


def test_malformed_json_is_retried_then_a_clear_error():
    with misbehaving_server(lambda h, n: reply(h, 200, b"<html>proxy error</html>")) as (url, attempts):
        client = HttpRetriever(url, retries=2, backoff_s=0.05)
        with pytest.raises(RetrievalError, match=r"failed 3 time\(s\); last error: JSONDecodeError") as info:
            client.search(["q"], 3)
        assert len(attempts) == 3 and isinstance(info.value, EnvError)
        assert attempts[2] - attempts[1] >= attempts[1] - attempts[0] >= 0.04  # exponential backoff


def test_server_errors_are_retried_until_one_succeeds():
    def respond(handler, attempt):
        reply(handler, 503, b'{"error": "busy"}') if attempt < 3 else reply(handler, 200, GOOD)

    with misbehaving_server(respond) as (url, attempts):
        [[passage]] = HttpRetriever(url, retries=3, backoff_s=0.01).search(["q"], 3)
        assert passage == Passage("d1", "T", "body text", 1.5) and len(attempts) == 3


def test_client_errors_and_redirects_are_not_retried():
    with misbehaving_server(lambda h, n: reply(h, 400, b'{"error": "bad topk"}')) as (url, attempts):
        with pytest.raises(RetrievalError, match="HTTP 400.*bad topk"):
            HttpRetriever(url, retries=3, backoff_s=0.01).search(["q"], 3)
        assert len(attempts) == 1
    redirect = {"Location": "file:///etc/passwd"}
    with misbehaving_server(lambda h, n: reply(h, 307, b"", headers=redirect)) as (url, attempts):
        with pytest.raises(RetrievalError, match="HTTP 307"):
            HttpRetriever(url, retries=3, backoff_s=0.01).search(["q"], 3)
        assert len(attempts) == 1


@pytest.mark.parametrize("declared", [True, False])
def test_oversized_responses_are_refused(declared):
    big = json.dumps({"result": [[{"document": {"id": "x", "contents": '"T"\n' + "y" * 300_000}, "score": 1}]]}).encode()
    protocol = "HTTP/1.1" if declared else "HTTP/1.0"  # without a length, the body ends when the server closes
    with misbehaving_server(lambda h, n: reply(h, 200, big, length=declared), protocol) as (url, attempts):
        with pytest.raises(RetrievalError, match="100,000-byte limit"):
            HttpRetriever(url, retries=3, backoff_s=0.01, max_response_bytes=100_000).search(["q"], 3)
        assert len(attempts) == 1
        assert len(HttpRetriever(url, max_response_bytes=1_000_000).search(["q"], 3)[0][0].text) == 300_000


def test_wrong_shapes_unreachable_servers_and_timeouts_are_clear_errors():
    wrong = json.dumps({"result": [[{"document": {"id": 1}}]]}).encode()
    with misbehaving_server(lambda h, n: reply(h, 200, wrong)) as (url, _):
        with pytest.raises(RetrievalError, match="without 'contents'"):
            HttpRetriever(url).search(["q"], 3)
    with misbehaving_server(lambda h, n: reply(h, 200, b'{"result": []}')) as (url, _):
        with pytest.raises(RetrievalError, match="one list per query"):
            HttpRetriever(url).search(["q"], 3)
    with misbehaving_server(lambda h, n: reply(h, 200, b'{"result": [{"document": {}}]}')) as (url, _):
        with pytest.raises(RetrievalError, match="not a list of lists"):
            HttpRetriever(url).search(["q"], 3)
    bm25_style = json.dumps({"result": [[{"title": "T", "text": "t", "contents": '"T"\nt'}]]}).encode()
    with misbehaving_server(lambda h, n: reply(h, 200, bm25_style)) as (url, _):  # Search-R1's BM25 server: no id, no score
        assert HttpRetriever(url).search(["q"], 3) == [[Passage("", "T", "t", 0.0)]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    with pytest.raises(RetrievalError, match=r"failed 2 time\(s\)"):
        HttpRetriever(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01).search(["q"], 3)
    with misbehaving_server(lambda h, n: time.sleep(1.0)) as (url, attempts):
        start = time.monotonic()
        with pytest.raises(RetrievalError, match="timed out"):
            HttpRetriever(url, timeout_s=0.2, retries=1, backoff_s=0.01).search(["q"], 3)
        assert time.monotonic() - start < 1.0 and len(attempts) == 2


# ---------------------------------------------------------------------------------------------
# Lucene query escaping (pure Python here; checked against Lucene itself in the pyserini tests)

LUCENE_SPECIALS = '+ - && || ! ( ) { } [ ] ^ " ~ * ? : \\ /'


def test_lucene_escape_covers_every_special_character():
    assert lucene_escape(LUCENE_SPECIALS) == r'\+ \- \&\& \|\| \! \( \) \{ \} \[ \] \^ \" \~ \* \? \: \\ \/'
    assert lucene_escape("plain words 123") == "plain words 123"
    assert lucene_escape("title:Osra AND (x OR y)") == r"title\:Osra AND \(x OR y\)"
    assert lucene_query("title:Osra AND (x OR y) NOT z ANDROID") == r"title\:Osra and \(x or y\) not z ANDROID"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_lucene_query_leaves_no_unescaped_special(text):
    query = lucene_query(text)
    unescaped = re.sub(r"\\.", "", query, flags=re.DOTALL)
    assert not re.search(r'[+\-!():^\[\]"{}~*?|&/\\]', unescaped)
    assert not re.search(r"\b(AND|OR|NOT)\b", unescaped)


# ---------------------------------------------------------------------------------------------
# pyserini (Lucene)


def _pyserini_missing() -> str | None:
    if importlib.util.find_spec("pyserini") is None:
        return "pyserini is not installed (pip install 'pyserini==1.6.0')"
    try:
        find_java_home(21)
    except MissingDependencyError as err:
        return str(err)
    return None


PYSERINI_MISSING = _pyserini_missing()
ENV_AT_IMPORT = {key: os.environ.get(key) for key in ("JAVA_HOME", "OPENAI_API_KEY")}


def needs_pyserini(test):
    """slow (a JVM: ~8 s to import pyserini, ~4 s to index), java, and skipped without pyserini or Java 21+."""
    for mark in (pytest.mark.slow, pytest.mark.java,
                 pytest.mark.skipif(PYSERINI_MISSING is not None, reason=PYSERINI_MISSING or "")):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def lucene_env(corpus_dir):
    env = SearchQAEnv(split="eval", retriever="pyserini")
    yield env
    env.close()


@needs_pyserini
def test_pyserini_env_checks_and_expert_plans_win(lucene_env):
    check_env(lucene_env)
    singles = [i for i, q in enumerate(lucene_env.questions) if q.type == "single"][:50]
    multis = [i for i, q in enumerate(lucene_env.questions) if q.type == "multi"][:50]
    rates = expert_rates(lucene_env, singles + multis)
    print("\npyserini expert (won, retrieved support, played):", rates)
    assert rates["single"][0] == rates["single"][2] == 50 and rates["multi"][0] == rates["multi"][2] == 50
    assert rates["single"][1] == 50 and rates["multi"][1] >= 48


@needs_pyserini
def test_pyserini_escaping_agrees_with_lucene(lucene_env, corpus_dir):
    from jnius import autoclass

    query_parser = autoclass("org.apache.lucene.queryparser.classic.QueryParser")
    retriever = lucene_env.retriever
    assert lucene_escape(LUCENE_SPECIALS) == query_parser.escape(LUCENE_SPECIALS)

    @settings(max_examples=200, deadline=None)
    @given(st.text(st.characters(min_codepoint=32, max_codepoint=0xFFFF, blacklist_categories=("Cs",)), max_size=60))
    def same_as_lucene_and_always_parses(text):
        assert lucene_escape(text) == query_parser.escape(text)
        retriever.search([text], 3)  # never a parse error

    same_as_lucene_and_always_parses()
    item = next(q for q in lucene_env.questions if q.type == "single")
    plain = retriever.search([item.question], 3)[0][0].id
    decorated = f'title:{item.question} AND (NOT "x" || y~2) +z -w [a TO b] {{c}} ^3 * ? \\ / !'
    assert retriever.search([decorated], 3)[0][0].id == plain == item.supporting_ids[0]
    assert retriever.search(["NOT", "AND OR", "\\", "the of"], 3) == [[], [], [], []]


@needs_pyserini
def test_pyserini_index_is_cached_and_env_vars_do_not_leak(lucene_env, corpus_dir):
    from agentkit.envs.search_qa.retrieval import PyseriniRetriever

    marker = corpus_dir / f"{CORPUS_FILE}.lucene" / "agentkit-index.json"
    before = marker.stat().st_mtime_ns
    second = PyseriniRetriever(corpus_dir / CORPUS_FILE)
    assert marker.stat().st_mtime_ns == before
    second.close()
    assert second._searcher is None
    assert {key: os.environ.get(key) for key in ENV_AT_IMPORT} == ENV_AT_IMPORT  # set only for pyserini's import


# ---------------------------------------------------------------------------------------------
# your own questions: train and eval kept apart, the index in the cache


def test_own_qa_file_keeps_train_and_eval_apart(tmp_path, agentkit_cache):
    folder = write_corpus(tmp_path / "mine", seed=3, num_passages=200)
    questions = read_qa(folder / TRAIN_FILE)[:10]
    qa = tmp_path / "my-questions.jsonl"
    qa.write_text("".join(json.dumps({"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers)})
                          + "\n" for q in questions))
    corpus = folder / CORPUS_FILE
    train = SearchQAEnv(split="train", corpus=corpus, qa=qa)
    try:
        assert [q.id for q in train.questions] == [q.id for q in questions]
    finally:
        train.close()
    # one file and the eval split: which questions are held out must be said
    with pytest.raises(ConfigError, match=r"split 'eval' with qa=.*my-questions.jsonl .*eval_qa=FILE.*eval_fraction"):
        SearchQAEnv(split="eval", corpus=corpus, qa=qa)
    # eval_fraction: the last share of the file is eval, the rest train
    split = {name: SearchQAEnv(split=name, corpus=corpus, qa=qa, eval_fraction=0.3) for name in ("train", "eval")}
    try:
        assert [q.id for q in split["train"].questions] == [q.id for q in questions[:7]]
        assert [q.id for q in split["eval"].questions] == [q.id for q in questions[7:]]
        assert split["eval"].num_tasks == 3
        with pytest.raises(ConfigError, match=r"task seeds for split 'eval' run from 0 to 2, got 3"):
            split["eval"].reset(seed=3)
    finally:
        for env in split.values():
            env.close()
    # eval_qa: a file of its own
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text(qa.read_text().splitlines()[0] + "\n")
    evals = SearchQAEnv(split="eval", corpus=corpus, qa=qa, eval_qa=held_out)
    try:
        assert evals.qa_path == held_out and evals.num_tasks == 1
    finally:
        evals.close()
    for bad, match in (({"eval_fraction": 1.0}, "between 0 and 1"), ({"eval_fraction": 0.95}, "leaves none to train"),
                       ({"eval_fraction": 0.2, "eval_qa": held_out}, "no eval_qa"),
                       ({"eval_fraction": 0.2, "qa": folder}, "single qa file")):
        with pytest.raises(ConfigError, match=match):
            SearchQAEnv(split="train", corpus=corpus, **{"qa": qa, **bad})
    # the index of a user's corpus goes to the cache; the user's folder is untouched
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.jsonl", "eval.jsonl", "meta.json", "train.jsonl"]
    index = index_dir_for(corpus, "bm25s")
    assert index.is_relative_to(agentkit_cache.resolve()) and (index / "agentkit-index.json").is_file()
