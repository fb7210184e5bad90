"""WebShop: the generated catalog, the original's reward, the original-data loader and the
environment, all real (bm25s retrieval; Lucene in a slow test)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from agentkit.envs import ActionParser, check_env, make, play_expert
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError

pytest.importorskip("bm25s", reason="needs the search extra (bm25s)")

from agentkit.envs.webshop.catalog import (  # noqa: E402
    CORPUS_FILE,
    META_FILE,
    PRODUCTS_FILE,
    generate,
    generated_dir,
    read_catalog,
)
from agentkit.envs.webshop.env import SEARCH_PLACEHOLDER, WebShopEnv, parse_action  # noqa: E402
from agentkit.envs.webshop.reward import (  # noqa: E402
    FUZZY_THRESHOLD,
    normalize_color,
    ratio,
    reward,
    title_nouns,
    token_set_ratio,
    type_reward,
)

SMALL = 400  # products in the catalogs the fast tests build


@pytest.fixture(scope="module")
def catalog_dir(agentkit_cache) -> Path:
    return generated_dir()


@pytest.fixture(scope="module")
def train_env(catalog_dir) -> WebShopEnv:
    env = WebShopEnv(split="train")
    yield env
    env.close()


@pytest.fixture(scope="module")
def eval_env(catalog_dir) -> WebShopEnv:
    env = WebShopEnv(split="eval")
    yield env
    env.close()


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


# ---------------------------------------------------------------------------------------------
# the original's reward, on hand-computed cases


def test_fuzzy_matching_golden_values():
    assert ratio("abc", "abc") == 100.0 and ratio("", "") == 0.0
    assert ratio("us 6", "us 7") == pytest.approx(75.0)  # LCS "us " = 3: 2 * 3 / 8
    assert token_set_ratio("us 6", "us 7") == 75  # best of "us"/"us 6" (66.7), "us"/"us 7", "us 6"/"us 7" (75)
    assert token_set_ratio("Fuzzy Wuzzy was a bear", "wuzzy fuzzy was a bear") == 100
    assert token_set_ratio("sulfate free", "sulfate free shampoo") == 100  # one word set contains the other
    assert token_set_ratio("2 ounce (pack of 1)", "3 ounce (pack of 1)") == 94  # "1 of ounce pack 2|3": 2 * 16 / 34
    assert token_set_ratio("", "anything") == 0
    assert token_set_ratio("8oz", "80oz") == 86 and token_set_ratio("8oz", "16oz") == 57  # 2*3/7, 2*2/7
    assert normalize_color("Navy Blue") == "blue"  # COLOR_SET order: blue before navy
    assert normalize_color("dark green") == "dark"
    assert normalize_color("standard") == "standard"  # whole words only (the original would say "tan")
    assert normalize_color("xl") == "xl"
    assert title_nouns("Acme Premium Shampoo for Dry Hair, 8 fl oz, Navy") == ["acme", "premium", "shampoo", "dry", "hair"]


def test_type_reward_cases():
    base = {"bought_query": "shampoo", "bought_category": "Beauty › Hair › Shampoos", "goal_query": "shampoo",
            "goal_category": "Beauty › Hair › Shampoos"}
    same = type_reward(**base, bought_title="Acme Shampoo", goal_title="Acme Shampoo")
    assert (same.r_type, same.query_match, same.category_match, same.title_score) == (1.0, True, True, 1.0)
    other = {"bought_query": "lipstick", "bought_category": "Beauty › Makeup › Lips", "goal_query": "shampoo",
             "goal_category": "Food › Hair › Shampoos"}  # one shared level: no category match
    # goal nouns acme, velvet, soft, shampoo, bottle: 1 of 5 shared = 0.2, not above 0.2 -> 0.5
    half = type_reward(**other, bought_title="Zeta Shampoo", goal_title="Acme Velvet Soft Shampoo Bottle")
    assert (half.r_type, half.query_match, half.category_match, half.title_score) == (0.5, False, False, 0.2)
    # the same titles with the query matching: 1.0
    assert type_reward(**{**other, "bought_query": "shampoo"}, bought_title="Zeta Shampoo",
                       goal_title="Acme Velvet Soft Shampoo Bottle").r_type == 1.0
    # 1 of 11 nouns shared: below 0.1 -> 0.1 whatever else matches
    long_title = "Acme Velvet Soft Shampoo Bottle Argan Keratin Salon Daily Repair Formula"
    low = type_reward(**base, bought_title="Zeta Shampoo", goal_title=long_title)
    assert low.title_score == pytest.approx(1 / 11) and low.r_type == 0.1
    none = type_reward(**base, bought_title="Zeta Lipstick", goal_title="Acme Shampoo")
    assert none.title_score == 0.0 and none.r_type == 0.0
    # a goal title without nouns scores 0.2 (the original's rule), then query/category decide
    assert type_reward(**base, bought_title="Zeta", goal_title="for the").r_type == 1.0
    assert type_reward(**other, bought_title="Zeta", goal_title="for the").r_type == 0.5


def _reward(**overrides):
    args = {
        "goal_attributes": ["sulfate free", "tea tree"], "goal_options": ["lavender", "8oz"], "price_upper": 30.0,
        "goal_query": "shampoo", "goal_category": "Beauty › Hair › Shampoos", "goal_title": "Acme Shampoo",
        "bought_attributes": ["sulfate free", "color safe"], "bought_title": "Acme Shampoo",
        "bought_features": ["Color safe."], "bought_description": "A gentle shampoo.", "bought_query": "shampoo",
        "bought_category": "Beauty › Hair › Shampoos", "price": 12.99, "chosen_options": ["lavender", "8oz"],
    }
    return reward(**{**args, **overrides})


def test_reward_combines_the_components_as_the_original():
    r = _reward()  # 1 of 2 attributes, 2 of 2 options, price ok: (1 + 2 + 1) / 5
    assert (r.attribute_matches, r.option_matches, r.r_price, r.r_type) == (1, 2, True, 1.0)
    assert r.total == pytest.approx(0.8) and r.r_attribute == 0.5 and r.r_option == 1.0
    # the missing attribute found in the description counts
    assert _reward(bought_description="With tea tree oil.").total == 1.0
    assert _reward(bought_features=["Tea Tree scent."]).total == 1.0  # features are lowercased first
    # over the price bound: (1 + 2 + 0) / 5
    assert _reward(price=30.01).total == pytest.approx(0.6) and _reward(price=30.0).r_price
    # one option wrong, one missing: (1 + 0 + 1) / 5; colours normalize ("navy blue" is "blue")
    assert _reward(chosen_options=["rose"]).total == pytest.approx(0.4)
    assert _reward(goal_options=["navy blue"], chosen_options=["blue"]).total == pytest.approx(3 / 4)
    # wrong type halves it (query and category differ, title score 0.5 of {acme, shampoo}... not > 0.2? it is)
    wrong = _reward(bought_query="lipstick", bought_category="Beauty › Makeup › Lips", bought_title="Acme Lipstick")
    assert wrong.title_score == 0.5 and wrong.r_type == 1.0 and wrong.total == pytest.approx(0.8)
    nothing = _reward(bought_query="lipstick", bought_category="Beauty › Makeup › Lips", bought_title="Zeta Lipstick")
    assert nothing.r_type == 0.0 and nothing.total == 0.0
    # no goal options: the denominator is |attributes| + 1
    assert _reward(goal_options=[], chosen_options=[]).total == pytest.approx(2 / 3)
    assert _reward(goal_options=[]).r_option is None


# ---------------------------------------------------------------------------------------------
# the generated catalog


def test_catalog_is_deterministic_across_processes(tmp_path):
    start = time.perf_counter()
    first = generate(seed=3, num_products=SMALL)
    assert time.perf_counter() - start < 10, "catalog generation must stay fast"
    assert generate(seed=3, num_products=SMALL) == first
    assert generate(seed=4, num_products=SMALL).products != first.products
    script = ("import sys, os; os.environ['AGENTKIT_CACHE'] = sys.argv[1]; "
              "from agentkit.envs.webshop.catalog import generated_dir; print(generated_dir(3, 400))")
    folders = []
    for name, hash_seed in (("a", "1"), ("b", "999")):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True, capture_output=True,
                             text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        folders.append(Path(out.stdout.strip()))
    for filename in (PRODUCTS_FILE, CORPUS_FILE, "train.jsonl", "eval.jsonl", META_FILE):
        assert (folders[0] / filename).read_bytes() == (folders[1] / filename).read_bytes(), filename
    assert folders[0].name == "seed3-n400-v1"
    with pytest.raises(ConfigError, match="num_products must be an integer from 100"):
        generated_dir(num_products=5)
    with pytest.raises(ConfigError, match="non-negative"):
        generate(seed=-1)


def test_generated_catalog_goals_are_satisfiable_and_splits_disjoint(catalog_dir):
    products, train = read_catalog(catalog_dir, "train")
    _, evals = read_catalog(catalog_dir, "eval")
    by_asin = {p.asin: p for p in products}
    assert len(products) == 3000 and len(by_asin) == 3000
    assert len({p.title for p in products}) == 3000
    assert Counter(p.category for p in products).keys() == {"beauty", "food", "fashion", "furniture", "electronics"}
    assert len(evals) == 300 and len(train) == 2700
    assert not {g.asin for g in train} & {g.asin for g in evals}, "train and eval goals come from disjoint products"
    assert not {g.instruction for g in train} & {g.instruction for g in evals}
    for goal in train + evals:
        gold = by_asin[goal.asin]
        assert set(goal.attributes) <= set(gold.attributes) and 1 <= len(goal.attributes) <= 3
        values = [v for _, vs in gold.options for v in vs]
        assert all(o in values for o in goal.options) and len(goal.options) == len(gold.options)
        assert gold.price <= goal.price_upper and goal.instruction.endswith(f"lower than {goal.price_upper:.2f} dollars")
        assert goal.name == gold.title and goal.query in goal.instruction
    for product in products:  # the reward can tell every option value and attribute of a product apart
        values = [normalize_color(v) for _, vs in product.options for v in vs]
        for group in (values, list(product.attributes)):
            for i, a in enumerate(group):
                assert all(token_set_ratio(a, b) <= FUZZY_THRESHOLD for b in group[i + 1:]), (product.asin, a)
    corpus = [json.loads(line) for line in (catalog_dir / CORPUS_FILE).read_text().splitlines()]
    assert [r["id"] for r in corpus] == [p.asin for p in products]
    assert all(r["contents"].startswith(f'"{r["title"]}"\n') and by_asin[r["id"]].attributes[0] in r["contents"]
               for r in corpus)


# ---------------------------------------------------------------------------------------------
# the environment


@pytest.mark.parametrize("text, expected", [
    ("search[red shoes]", ("search", "red shoes")),
    ("  Click [ Buy Now ] ", ("click", "Buy Now")),
    ("click[< Prev]", ("click", "< Prev")),
    ("click[a [b] c]", ("click", "a [b] c")),
    ("search[]", ("search", "")),
    ("search red shoes", None),
    ("buy[now]", None),
    ("click[x] and then", None),
    (None, None),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize("split", ["train", "eval"])
def test_check_env(split, catalog_dir):
    env = WebShopEnv(split=split)
    try:
        check_env(env, seed=0)
        check_env(env, seed=env.num_tasks - 1)
    finally:
        env.close()


def test_expert_wins_30_train_and_30_eval_tasks(train_env, eval_env):
    for env in (train_env, eval_env):
        steps = []
        for seed in range(0, env.num_tasks, env.num_tasks // 30)[:30]:
            _, info = env.reset(seed=seed)
            plan = list(info["expert_plan"])
            assert plan[0].startswith("search[") and plan[-1] == "click[Buy Now]"
            won, n = play_expert(env, seed)
            assert won, (env.split, seed, plan)
            steps.append(n)
        assert max(steps) <= 12


def test_pages_buttons_and_navigation(train_env):
    env = train_env
    seed = next(i for i, g in enumerate(env.goals) if len(g.options) >= 2)
    goal = env.goals[seed]
    obs, info = env.reset(seed=seed)
    assert obs.startswith(f"Instruction: {goal.instruction}") and "search[your query]" in obs
    assert info["admissible_actions"] == [SEARCH_PLACEHOLDER] and info["page"] == "search"
    assert info["task"] == goal.instruction and info["task_type"] == goal.category
    gold = env.products[goal.asin]
    assert f"[{gold.asin}] {gold.title}" in info["privileged"] and "Price bound: lower than $" in info["privileged"]

    obs, _, _, _, info = env.step(f"search[{goal.query}]")
    results = env.search(goal.query)
    assert len(results) == 50 and info["page"] == "results"
    assert "page 1 of 5 (total results: 50)" in obs and "[Next >]" in obs and "[< Prev]" not in obs
    assert info["admissible_actions"][:2] == ["click[Back to Search]", "click[Next >]"]
    assert [a for a in info["admissible_actions"] if a.startswith("click[B0")] == [f"click[{a}]" for a in results[:10]]
    obs, _, _, _, info = env.step("click[Next >]")
    assert "page 2 of 5" in obs and f"[{results[10]}]" in obs and "click[< Prev]" in info["admissible_actions"]
    obs, _, _, _, info = env.step("search[again]")
    assert not info["action_valid"] and "only on the search page" in obs and "page 2 of 5" in obs
    obs, _, _, _, info = env.step("click[< Prev]")
    assert "page 1 of 5" in obs

    other = env.products[results[0]]
    obs, _, _, _, info = env.step(f"click[{other.title.upper()}]")  # a title works as the product's button
    assert info["page"] == "item" and other.title in obs and f"Price: {other.price_tag}" in obs
    obs, _, _, _, info = env.step("click[features]")
    assert info["page"] == "item_sub" and other.features[0] in obs
    assert info["admissible_actions"] == ["click[Back to Search]", "click[< Prev]"]
    obs, _, _, _, info = env.step("click[< Prev]")
    assert info["page"] == "item"
    env.step("click[< Prev]")
    obs, _, _, _, info = env.step("click[Back to Search]")
    assert info["page"] == "search" and info["admissible_actions"] == [SEARCH_PLACEHOLDER]

    # the gold product: choose options (a later value of an option replaces the earlier one)
    env.step(f"search[{gold.title}]")
    obs, _, _, _, info = env.step(f"click[{gold.asin.lower()}]")
    (name, values), *_ = gold.options
    assert f"{name}: " + " ".join(f"[{v}]" for v in values) + " (none chosen)" in obs
    env.step(f"click[{values[0]}]")
    obs, _, _, _, info = env.step(f"click[{values[1]}]")
    assert f"(chosen: {values[1]})" in obs
    # a round trip through a sub-page keeps the choice; re-opening the product clears it
    env.step("click[Description]")
    obs, _, _, _, _ = env.step("click[< Prev]")
    assert f"(chosen: {values[1]})" in obs
    env.step("click[< Prev]")
    obs, _, _, _, info = env.step(f"click[{gold.asin}]")
    assert f"{name}: " + " ".join(f"[{v}]" for v in values) + " (none chosen)" in obs
    assert info["expert_plan"][-1] == "click[Buy Now]" and info["expert_plan"][0] != f"click[{gold.asin}]"
    for action in info["expert_plan"]:
        obs, reward, terminated, _, info = env.step(action)
    assert terminated and reward == 1.0 and info["won"] and info["score"] == 1.0
    assert info["reward_components"]["total"] == 1.0 and info["purchased"]["asin"] == gold.asin
    assert "Your score (min 0.0, max 1.0): 1.00" in obs and info["expert_plan"] == [] and info["admissible_actions"] == []
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("click[Buy Now]")


def test_buying_without_options_scores_the_components(eval_env):
    env = eval_env
    seed = next(i for i, g in enumerate(env.goals) if g.options)
    goal = env.goals[seed]
    env.reset(seed=seed)
    env.step(f"search[{goal.name}]")
    env.step(f"click[{goal.asin}]")
    _, reward, terminated, _, info = env.step("click[Buy Now]")
    parts = info["reward_components"]
    expected = (len(goal.attributes) + 0 + 1) / (len(goal.attributes) + len(goal.options) + 1)
    assert terminated and reward == pytest.approx(expected) and info["score"] == reward and not info["won"]
    assert (parts["attribute_matches"], parts["option_matches"], parts["r_price"], parts["r_type"]) == (
        len(goal.attributes), 0, True, 1.0)


HOSTILE = ["", "xyzzy", "search[]", "search[   ]", "click[]", "click[nothing here]", "click[Buy Now]",
           "search[" + "x" * 600 + "]", "click[" + "\x00\ud800" + "]", "<action>click[Next >]</action>",
           "click[Back to Search", "search [ \t ]", "click[search]", "\n\n", "click[Next >]"]


def test_invalid_actions_leave_the_page_unchanged(train_env):
    env = train_env
    obs, _ = env.reset(seed=5)
    for bad in HOSTILE:
        out, reward, terminated, truncated, info = env.step(bad)
        assert not info["action_valid"] and reward == 0 and not terminated and not truncated, bad
        assert out.startswith("Invalid action: ") and out.endswith(obs) and info["page"] == "search", bad
    plan = env.reset(seed=5)[1]["expert_plan"]
    obs, _, _, _, info = env.step(plan[0])
    for bad in ["search[shoes]", "click[Buy Now]", "click[Description]", "click[B0NOTANASIN]", "click[" + "\ud800" * 3 + "]"]:
        out, reward, terminated, _, info = env.step(bad)
        assert not info["action_valid"] and reward == 0 and not terminated and out.endswith(obs), bad
    assert info["expert_plan"] == plan[1:]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["search", "results", "item"]), st.lists(st.one_of(st.text(max_size=30), st.sampled_from(
    ["search[", "click[", "]", "[", "Buy Now", "< Prev", "Next >", "\x00", "\ud800", "\n", "B0"])), max_size=8).map("".join))
def test_step_never_raises_on_model_text(train_env, where, text):
    env = train_env
    obs, info = env.reset(seed=7)
    for action in info["expert_plan"][:{"search": 0, "results": 1, "item": 2}[where]]:
        obs, _, _, _, info = env.step(action)
    out, reward, terminated, truncated, info = env.step(text)
    assert isinstance(out, str) and isinstance(info["action_valid"], bool) and not truncated
    if not info["action_valid"]:
        assert reward == 0 and not terminated and out.endswith(obs) and info["page"] == where


def test_a_search_without_matches_shows_an_empty_page(train_env):
    train_env.reset(seed=0)
    obs, _, _, _, info = train_env.step("search[zzqqxx]")
    assert "(total results: 0)" in obs and "No products matched" in obs
    assert info["admissible_actions"] == ["click[Back to Search]"] and info["expert_plan"][0] == "click[Back to Search]"


def test_expert_plan_recovers_from_detours(train_env):
    env = train_env
    _, info = env.reset(seed=11)
    goal = env.goals[11]
    env.step("search[wireless mouse ergonomic]")
    results = env.search("wireless mouse ergonomic")
    wrong = next(a for a in results if a != goal.asin)
    env.step(f"click[{wrong}]")
    _, _, _, _, info = env.step("click[Reviews]")
    plan = info["expert_plan"]
    assert plan[0] == "click[< Prev]" and plan[-1] == "click[Buy Now]"
    for action in plan:
        _, _, terminated, _, info = env.step(action)
        assert info["action_valid"], action
    assert terminated and info["won"]


def test_registry_ids_wrappers_and_missing_data(catalog_dir, monkeypatch):
    env = make("webshop/generated-v0", split="eval")
    try:
        check_env(env)
    finally:
        env.close()
    env = make("webshop/generated-v0", split="eval", max_turns=4, action_parser=ActionParser())
    try:
        assert type(env.unwrapped) is WebShopEnv
        _, info = env.reset(seed=2)
        _, _, _, _, info = env.step(f"I will search. <action>{info['expert_plan'][0]}</action>")
        assert info["action_valid"] and info["page"] == "results"
        _, _, _, _, info = env.step("no tags")
        assert not info["action_valid"]
    finally:
        env.close()
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(MissingDependencyError, match="pass data_dir=PATH"):
        make("webshop/original-v0")
    with pytest.raises(ConfigError, match="split must be one of"):
        WebShopEnv(split="test")
    with pytest.raises(ConfigError, match="use webshop/original-v0"):
        make("webshop/generated-v0", data_dir="/tmp")
    with pytest.raises(ConfigError, match="Did you mean 'bm25s'"):
        WebShopEnv(retriever="bm25")
    env = WebShopEnv(split="eval")
    try:
        with pytest.raises(ConfigError, match="run from 0 to 299"):
            env.reset(seed=300)
    finally:
        env.close()


def test_skill_bank_is_the_default_for_the_family():
    from agentkit.skillbank.bank import SkillBank, default_bank_for, resolve_bank

    assert default_bank_for("webshop/generated-v0") == "webshop"
    bank = SkillBank.load(resolve_bank("webshop"))
    assert len(bank.for_env("webshop/original-v0")) >= 6
    assert "ws.fashion-size" in [s.id for s in bank.for_env("webshop/generated-v0", "fashion")]
    assert "ws.fashion-size" not in [s.id for s in bank.for_env("webshop/generated-v0", "food")]


# ---------------------------------------------------------------------------------------------
# the original data files


def _original_files(folder: Path) -> Path:
    """A few records in the original's schema, written by hand."""
    products = [
        {"asin": "B078GWRC1J", "name": "Bright Citrus Deodorant by Earth Mama | Natural and Safe for Sensitive Skin",
         "category": "beauty", "query": "deodorant", "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
         "full_description": "Calendula deodorant for sensitive skin.", "small_description": ["Aluminum free", "Travel size"],
         "pricing": "$10.99", "images": ["x.jpg"],
         "customization_options": {"Scent": [{"value": "Bright Citrus", "image": None}, {"value": "Calming Lavender", "image": None}],
                                   "Size": [{"value": "3 Ounce (Pack of 1)", "image": None}, {"value": "2-Pack/3 Ounce", "image": None}]}},
        {"asin": "B09QKP7XQL", "name": "Wireless Bluetooth Headphones Over Ear with Mic",
         "category": "electronics", "query": "headphones", "product_category": "Electronics › Headphones › Over-Ear Headphones",
         "full_description": "Foldable headphones with a 40 hour battery.", "small_description": "Noise isolating earcups",
         "pricing": "$25.00 - $35.00", "images": ["y.jpg"],
         "customization_options": {"Color": [{"value": "Black", "image": None}, {"value": "Navy Blue", "image": None}]}},
        {"asin": "B07TESTXYZ", "name": "Organic Green Tea Bags, 100 Count", "category": "food", "query": "green tea",
         "product_category": "Grocery & Gourmet Food › Beverages › Tea › Green", "full_description": "Smooth organic tea.",
         "small_description": ["Organic", "Caffeinated"], "pricing": "", "images": ["z.jpg"], "customization_options": None},
        {"asin": "B078GWRC1J", "name": "a duplicate the original skips", "category": "beauty", "query": "x",
         "product_category": "", "full_description": "", "small_description": [], "pricing": "$1.00", "images": [""],
         "customization_options": None},
        {"asin": "nan", "name": "no asin", "category": "food", "query": "x", "product_category": "", "full_description": "",
         "small_description": [], "pricing": "$1.00", "images": [""], "customization_options": None},
    ]
    attributes = {
        "B078GWRC1J": {"attributes": ["sensitive skin", "aluminum free"], "instruction": "i need a natural deodorant",
                       "instruction_attributes": ["sensitive skin"]},
        "B09QKP7XQL": {"attributes": ["wireless bluetooth", "noise isolating"], "instruction": "i want wireless headphones",
                       "instruction_attributes": ["wireless bluetooth"]},
        "B07TESTXYZ": {"attributes": ["organic"], "instruction": "i need organic green tea", "instruction_attributes": ["organic"]},
    }
    def ins(asin, text, attrs, opts):
        return {"asin": asin, "instruction": text, "instruction_attributes": attrs, "instruction_options": opts}

    human = {
        "B078GWRC1J": [
            ins("B078GWRC1J", "i am looking for a deodorant for sensitive skin in calming lavender scent.",
                ["sensitive skin", "aluminum free"], ["calming lavender", "3 ounce (pack of 1)"]),
            ins("B078GWRC1J", "a deodorant please", [], []),  # no attributes: the original skips it
            ins("B078GWRC1J", "aluminum free deodorant, bright citrus", ["aluminum free"], ["bright citrus"]),
            ins("B078GWRC1J", "deodorant for sensitive skin two pack", ["sensitive skin"], ["2-pack | 3 ounce"]),
            ins("B078GWRC1J", "citrus deodorant travel size", ["travel size"], ["bright citrus"]),
        ],
        "B09QKP7XQL": [
            ins("B09QKP7XQL", "i want navy blue wireless bluetooth headphones", ["wireless bluetooth"], ["navy blue"]),
            ins("B09QKP7XQL", "black headphones that are noise isolating", ["noise isolating"], ["black"]),
            ins("B09QKP7XQL", "over ear headphones with a long battery", ["40 hour battery"], []),
        ],
        "B07TESTXYZ": [
            ins("B07TESTXYZ", "organic green tea bags", ["organic"], []),
            ins("B07TESTXYZ", "caffeinated green tea", ["caffeinated"], []),
            ins("B07TESTXYZ", "smooth organic tea", ["organic", "smooth"], []),
        ],
    }
    folder.mkdir()
    (folder / "items_shuffle_1000.json").write_text(json.dumps(products))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attributes))
    (folder / "items_human_ins.json").write_text(json.dumps(human))
    return folder


def test_original_files_load_and_play(tmp_path):
    from agentkit.envs.webshop.original import load_original

    data_dir = _original_files(tmp_path / "data")
    products, splits = load_original(data_dir, "human")
    by_asin = {p.asin: p for p in products}
    assert sorted(by_asin) == ["B078GWRC1J", "B07TESTXYZ", "B09QKP7XQL"]  # the duplicate and "nan" are skipped
    deodorant = by_asin["B078GWRC1J"]
    assert deodorant.options == (("scent", ("bright citrus", "calming lavender")),
                                 ("size", ("3 ounce (pack of 1)", "2-pack | 3 ounce")))
    assert deodorant.title.startswith("Bright Citrus") and deodorant.features == ("Aluminum free", "Travel size")
    assert deodorant.price == 10.99 and deodorant.price_tag == "$10.99"
    headphones, tea = by_asin["B09QKP7XQL"], by_asin["B07TESTXYZ"]
    assert headphones.price_tag == "$25.0 to $35.0" and 25.0 <= headphones.price <= 35.0
    assert tea.price == 100.0 and tea.features == ("Organic", "Caffeinated") and headphones.features == ("Noise isolating earcups",)
    assert [len(splits[s]) for s in ("train", "eval", "test")] == [7, 2, 1]  # a tenth test, a fifth eval
    goals = [g for split in splits.values() for g in split]
    assert len({g.id for g in goals}) == 10 and not any(g.asin == "B078GWRC1J" and not g.attributes for g in goals)
    assert all(g.price_upper >= by_asin[g.asin].price for g in goals)
    synthetic = [g for split in load_original(data_dir, "synthetic")[1].values() for g in split]
    assert len(synthetic) == 4 + 2 + 1  # every option combination of each product with an instruction
    assert any(g.instruction.startswith("i need a natural deodorant with scent: calming lavender, and size: ") for g in synthetic)

    for split in ("train", "eval", "test"):
        env = WebShopEnv(source="original", data_dir=data_dir, split=split)
        try:
            check_env(env)
            for seed in range(env.num_tasks):
                assert play_expert(env, seed)[0], (split, seed, env.goals[seed])
        finally:
            env.close()


def test_original_data_dir_errors(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no products"):
        WebShopEnv(source="original", data_dir=tmp_path / "empty")
    monkeypatch.setenv("WEBSHOP_DATA", str(_original_files(tmp_path / "data")))
    env = make("webshop/original-v0", split="train")
    try:
        assert env.unwrapped.source == "original"
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# worker processes and the command line


def test_worker_rollout_equals_in_process_rollout(backend, catalog_dir):
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.workers import InProcessEnvs, WorkerPool

    make_env = functools.partial(make, "webshop/generated-v0", split="eval", max_turns=3,
                                 action_parser=ActionParser(require_match=False))
    specs = [EpisodeSpec(s, k) for s in range(2) for k in range(2)]
    runs = []
    for envs in (InProcessEnvs(make_env), WorkerPool(make_env, 1)):
        collector = Collector(backend, envs, env_id="webshop/generated-v0", sampling=SamplingParams(max_new_tokens=8, seed=5),
                              max_in_flight=4, batch_wait_s=0.0)
        written = []
        collector.run(specs, written.append)
        collector.close()
        runs.append({t.id: ([turn.response_ids for turn in t.turns], [turn.feedback for turn in t.turns]) for t in written})
    assert runs[0] == runs[1] and len(runs[0]) == 4

    # the expert's episode through a worker gives the same pages and reward as in this process
    played = []
    make_plain = functools.partial(make, "webshop/generated-v0", split="eval")
    for envs in (InProcessEnvs(make_plain), WorkerPool(make_plain, 1)):
        envs.submit(0, "reset", 4)
        outcomes = []
        while True:
            results = []
            while not results:
                results = envs.poll(timeout=60)
            (result,) = results
            assert result.error is None, result.error
            outcomes.append(result.value[:-1] if result.op == "step" else result.value[0])
            info = result.value[-1]
            if result.op == "step" and (result.value[2] or result.value[3]) or not info["expert_plan"]:
                break
            envs.submit(0, "step", info["expert_plan"][0])
        envs.close()
        played.append((outcomes, info["won"]))
    assert played[0] == played[1] and played[0][1] is True


@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_cli_lists_checks_and_rolls_out(tiny_model_dir, catalog_dir, tmp_path):
    from agentkit.core.jsonl import read_trajectories

    listed = run_cli("envs", "list")
    assert "webshop/generated-v0" in listed.stdout and "webshop/original-v0" in listed.stdout
    checked = run_cli("envs", "check", "webshop/generated-v0", "--tasks", "3")
    assert checked.returncode == 0, checked.stderr
    assert "expert won 3/3 tasks" in checked.stdout
    out = tmp_path / "ws.jsonl"
    result = run_cli("rollout", "--env", "webshop/generated-v0", "--model", str(tiny_model_dir), "--episodes", "2",
                     "--max-turns", "2", "--out", str(out), "--env-workers", "1")
    assert result.returncode == 0, result.stderr
    trajectories = read_trajectories(out, strict=True)
    assert len(trajectories) == 2 and all(t.env == "webshop/generated-v0" for t in trajectories)
    assert all(t.task_type in {"beauty", "food", "fashion", "furniture", "electronics"} for t in trajectories)


@pytest.mark.slow
@pytest.mark.java
def test_expert_wins_with_lucene(catalog_dir):
    pytest.importorskip("pyserini", reason="needs pyserini (pip install 'agentkit[pyserini]') and Java 21+")
    from agentkit.envs.search_qa.retrieval import find_java_home

    try:
        find_java_home()
    except MissingDependencyError as err:
        pytest.skip(str(err))
    env = WebShopEnv(split="eval", retriever="pyserini")
    try:
        check_env(env)
        assert all(play_expert(env, seed)[0] for seed in range(30))
    finally:
        env.close()
