"""WebShop (Yao et al. 2022) in text mode: search a product catalog, pick options, buy.

Each ``reset(seed=s)`` gives goal ``s`` of the split: an instruction such as "i need a sulfate free
shampoo, in lavender scent and size 8oz, and price lower than 30.00 dollars". Actions are the
original's two verbs (the model writes them inside ``<action>...</action>``):

- ``search[query]``, only on the search page: the catalog's best 50 matches (our retrieval
  backends, bm25s by default or Lucene through pyserini), 10 per results page;
- ``click[button]``: on a results page ``Back to Search``, ``Next >``, ``< Prev`` and a product's
  id or title; on a product page its option values, ``Description``, ``Features``, ``Reviews``,
  ``< Prev`` (back to the results), ``Back to Search`` and ``Buy Now``; on a description, features
  or reviews page ``< Prev`` (back to the product) and ``Back to Search``. Buttons match without
  regard to case, as in the original (which lowercases both sides).

``Buy Now`` ends the episode with the original's reward (``agentkit.envs.webshop.reward``), the
episode's only non-zero reward; ``info["score"]`` is it, ``info["won"]`` is score == 1 and
``info["reward_components"]`` holds its parts. Choosing a value of an option replaces the earlier
choice of that option; opening a product starts with no options chosen.

Departures from the original: pages are plain lines with ``[button]`` marks instead of
``[SEP]``-joined fields, and a product page says which option values are chosen (the original's
text mode does not show it); an invalid action (a search away from the search page, a button not
on the page, text that is neither verb) leaves the page unchanged and says why above it, where the
original repeats the page silently. ``info["expert_plan"]`` is recomputed from the current page
every step: the search the expert would type (the goal's attributes and product type, or the gold
product's title when that query does not find it), the page turns and the click on the gold
product, the goal's options, ``Buy Now``.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agentkit.envs.gym import TextEnv
from agentkit.envs.protocol import task_index
from agentkit.envs.search_qa.retrieval import Retriever, make_retriever
from agentkit.envs.webshop.catalog import (
    CORPUS_FILE,
    DEFAULT_NUM_PRODUCTS,
    GENERATED_SPLITS,
    Goal,
    Product,
    generated_dir,
    read_catalog,
)
from agentkit.envs.webshop.reward import FUZZY_THRESHOLD, normalize_color, reward, token_set_ratio

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError, did_you_mean

SOURCES = ("generated", "original")
RETRIEVERS = ("bm25s", "pyserini")
MAX_RESULTS = 50  # the original's search returns the top 50
RESULTS_PER_PAGE = 10
MAX_QUERY_CHARS = 500
SEARCH_PLACEHOLDER = "search[<your query>]"
SUB_PAGES = ("description", "features", "reviews")
DATA_ENV_VAR = "WEBSHOP_DATA"

_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", flags=re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Page:
    """Where the shopper is: ``kind`` is search, results, item, item_sub or done."""

    kind: str
    query: str = ""
    page_number: int = 1
    asin: str = ""
    sub_page: str = ""


def parse_action(text: Any) -> tuple[str, str] | None:
    """``search[query]`` / ``click[button]`` as (verb, argument with whitespace collapsed), or None."""
    if not isinstance(text, str):
        return None
    match = _ACTION.match(text)
    if match is None:
        return None
    argument = "".join(ch if ch.isprintable() else " " for ch in match.group(2))
    return match.group(1).lower(), " ".join(argument.split())


def best_option(product: Product, wanted: str) -> tuple[str, str] | None:
    """The (option name, value) of ``product`` that fuzzily matches the goal option ``wanted``
    best (an exact value first), or None when none passes the reward's threshold."""
    best, best_score = None, FUZZY_THRESHOLD
    for name, values in product.options:
        for value in values:
            if value == wanted.lower():
                return name, value
            score = token_set_ratio(normalize_color(value), normalize_color(wanted))
            if score > best_score:
                best, best_score = (name, value), score
    return best


class WebShopEnv(TextEnv):
    """WebShop's shopping tasks over a generated catalog or the original data.

    Args:
        split: "train" or "eval" (generated: goals from disjoint products); the original data also
            has "test".
        source: "generated" (the catalog made offline from ``catalog_seed``) or "original" (the
            files of WebShop's setup.sh in ``data_dir``).
        data_dir: the original's data folder (default: ``$WEBSHOP_DATA``); for source "original".
        goals: for the original data, "human" (the 12k human instructions) or "synthetic".
        catalog_seed: seed of the generated catalog.
        num_products: size of the generated catalog.
        retriever: "bm25s" (default) or "pyserini" (Lucene; Java 21+).
        retriever_options: extra keyword arguments for the backend (``index_dir``, ``java_home``).
    """

    def __init__(self, split: str = "train", source: str = "generated", data_dir: str | os.PathLike | None = None,
                 goals: str = "human", catalog_seed: int = 0, num_products: int = DEFAULT_NUM_PRODUCTS,
                 retriever: str = "bm25s", retriever_options: dict[str, Any] | None = None) -> None:
        if source not in SOURCES:
            raise ConfigError(f"source must be one of {list(SOURCES)}, got {source!r}.{did_you_mean(str(source), SOURCES)}")
        if retriever not in RETRIEVERS:
            raise ConfigError(f"Unknown retriever {retriever!r}; WebShop searches with one of {list(RETRIEVERS)}."
                              f"{did_you_mean(str(retriever), RETRIEVERS)}")
        if source == "generated":
            if data_dir is not None:
                raise ConfigError("data_dir is read by the original data source only: use webshop/original-v0 "
                                  "(source='original') with it, or drop it for the generated catalog.")
            if split not in GENERATED_SPLITS:
                raise ConfigError(f"split must be one of {list(GENERATED_SPLITS)} for the generated catalog, got {split!r}.")
            folder = generated_dir(catalog_seed, num_products)
        else:
            from agentkit.envs.webshop.original import ORIGINAL_SPLITS, original_dir

            data_dir = data_dir or os.environ.get(DATA_ENV_VAR)
            if not data_dir:
                raise MissingDependencyError(
                    "WebShop's original data is not here: pass data_dir=PATH (--env-kwargs data_dir=PATH) or set "
                    f"{DATA_ENV_VAR} to the data/ folder of WebShop's setup.sh (items_shuffle.json, items_ins_v2.json, "
                    "items_human_ins.json); webshop/generated-v0 needs no download."
                )
            if split not in ORIGINAL_SPLITS:
                raise ConfigError(f"split must be one of {list(ORIGINAL_SPLITS)} for the original data, got {split!r}.")
            folder = original_dir(Path(data_dir), goals)
        self.split, self.source, self.folder = split, source, folder
        products, self.goals = read_catalog(folder, split)
        self.products: dict[str, Product] = {p.asin: p for p in products}
        self.retriever: Retriever | None = make_retriever(retriever, corpus=folder / CORPUS_FILE, **(retriever_options or {}))
        self._search_cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._expert_queries: dict[str, str] = {}
        self._goal: Goal | None = None
        self._page = Page("done")
        self._chosen: dict[str, str] = {}
        self._score, self._won = 0.0, False
        self._components: dict[str, Any] | None = None

    @property
    def num_tasks(self) -> int:
        """Goals in this split (valid reset seeds are 0 .. num_tasks - 1)."""
        return len(self.goals)

    # -- protocol ----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if self.retriever is None:
            raise EnvError("reset() after close(); build a new WebShopEnv.")
        seed = self.task_seed(seed, len(self.goals))
        index = task_index(seed, len(self.goals), family="WebShop", split=self.split)
        self._goal = self.goals[index]
        self._page, self._chosen = Page("search"), {}
        self._score, self._won, self._components = 0.0, False, None
        return self._render(), self._info(action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._goal is None or self._page.kind == "done" or self.retriever is None:
            raise EnvError("step() called before reset(), after the episode ended or after close(); call reset() first.")
        parsed = parse_action(action)
        if parsed is None:
            return self._invalid("write search[your query] or click[a button on the page].")
        verb, argument = parsed
        if verb == "search":
            if self._page.kind != "search":
                return self._invalid("search[...] works only on the search page; click[Back to Search] first.")
            if not argument:
                return self._invalid("the search query is empty.")
            if len(argument) > MAX_QUERY_CHARS:
                return self._invalid(f"the search query is longer than {MAX_QUERY_CHARS} characters.")
            self._page = Page("results", query=argument.lower())
            return self._render(), 0.0, False, False, self._info(action_valid=True)
        target = self._clickables().get(argument.lower())
        if target is None:
            return self._invalid(f"there is no button {argument!r} on this page.")
        return self._click(target)

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
            self.retriever = None

    # -- pages -------------------------------------------------------------------------------

    def search(self, query: str) -> tuple[str, ...]:
        """The asins the catalog's search engine returns for ``query``, best first (at most 50)."""
        if query not in self._search_cache:
            passages = self.retriever.search([query], MAX_RESULTS)[0]
            self._search_cache[query] = tuple(p.id for p in passages if p.id in self.products)
            if len(self._search_cache) > 256:
                self._search_cache.popitem(last=False)
        return self._search_cache[query]

    def _num_pages(self, query: str) -> int:
        return max(1, -(-len(self.search(query)) // RESULTS_PER_PAGE))

    def _page_results(self, page: Page) -> tuple[str, ...]:
        start = (page.page_number - 1) * RESULTS_PER_PAGE
        return self.search(page.query)[start:start + RESULTS_PER_PAGE]

    def _buttons(self) -> list[tuple[str, tuple]]:
        """(label as shown, target) for each button of the current page, in page order."""
        page = self._page
        if page.kind == "results":
            buttons: list[tuple[str, tuple]] = [("Back to Search", ("search",))]
            if page.page_number > 1:
                buttons.append(("< Prev", ("results", page.page_number - 1)))
            if page.page_number < self._num_pages(page.query):
                buttons.append(("Next >", ("results", page.page_number + 1)))
            buttons += [(asin, ("item", asin)) for asin in self._page_results(page)]
            return buttons
        if page.kind == "item":
            product = self.products[page.asin]
            buttons = [("Back to Search", ("search",)), ("< Prev", ("results", page.page_number))]
            buttons += [(value, ("option", name, value)) for name, values in product.options for value in values]
            buttons += [(sub.capitalize(), ("item_sub", sub)) for sub in SUB_PAGES]
            return buttons + [("Buy Now", ("buy",))]
        if page.kind == "item_sub":
            return [("Back to Search", ("search",)), ("< Prev", ("item",))]
        return []

    def _clickables(self) -> dict[str, tuple]:
        """Lowercased button text -> target; on a results page a product's title works as its id."""
        found: dict[str, tuple] = {}
        for label, target in self._buttons():
            found.setdefault(label.lower(), target)
        if self._page.kind == "results":
            for asin in self._page_results(self._page):
                found.setdefault(" ".join(self.products[asin].title.lower().split()), ("item", asin))
        return found

    def _click(self, target: tuple) -> tuple[str, float, bool, bool, dict[str, Any]]:
        page, kind = self._page, target[0]
        if kind == "search":
            self._page = Page("search")
        elif kind == "results":
            self._page = Page("results", query=page.query, page_number=target[1])
        elif kind == "item" and page.kind == "results":
            self._page, self._chosen = replace(page, kind="item", asin=target[1]), {}
        elif kind == "item":  # back from a sub-page
            self._page = replace(page, kind="item", sub_page="")
        elif kind == "item_sub":
            self._page = replace(page, kind="item_sub", sub_page=target[1])
        elif kind == "option":
            self._chosen[target[1]] = target[2]
        elif kind == "buy":
            return self._buy()
        return self._render(), 0.0, False, False, self._info(action_valid=True)

    def _buy(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        goal, product = self._goal, self.products[self._page.asin]
        breakdown = reward(
            goal_attributes=goal.attributes, goal_options=goal.options, price_upper=goal.price_upper,
            goal_query=goal.query, goal_category=goal.product_category, goal_title=goal.name,
            bought_attributes=product.attributes, bought_title=product.title, bought_features=product.features,
            bought_description=product.description, bought_query=product.query,
            bought_category=product.product_category, price=product.price, chosen_options=self._chosen.values(),
        )
        self._components = asdict(breakdown)
        self._score, self._won = breakdown.total, breakdown.total == 1.0
        bought, chosen = self._page.asin, dict(self._chosen)
        self._page = replace(self._page, kind="done")
        options_text = ", ".join(f"{k}: {v}" for k, v in chosen.items()) or "none"
        obs = (f"Thank you for shopping with us! You bought [{bought}] {product.title} (options: {options_text}) "
               f"for ${product.price:.2f}.\nYour score (min 0.0, max 1.0): {breakdown.total:.2f}")
        info = self._info(action_valid=True)
        info["purchased"] = {"asin": bought, "options": chosen}
        return obs, breakdown.total, True, False, info

    def _render(self) -> str:
        page = self._page
        lines = [f"Instruction: {self._goal.instruction}"]
        if page.kind == "search":
            lines += ["WebShop search page. Search the catalog with search[your query]."]
        elif page.kind == "results":
            total = len(self.search(page.query))
            nav = " ".join(f"[{label}]" for label, target in self._buttons() if target[0] in ("search", "results"))
            lines += [nav, f"Results for {page.query!r}: page {page.page_number} of {self._num_pages(page.query)} "
                           f"(total results: {total})"]
            if not total:
                lines.append("No products matched your search.")
            for asin in self._page_results(page):
                product = self.products[asin]
                lines.append(f"[{asin}] {product.title} | {product.price_tag}")
        elif page.kind == "item":
            product = self.products[page.asin]
            lines += ["[Back to Search] [< Prev]", product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
            for name, values in product.options:
                chosen = self._chosen.get(name)
                lines.append(f"{name}: " + " ".join(f"[{v}]" for v in values)
                             + (f" (chosen: {chosen})" if chosen else " (none chosen)"))
            lines.append("[Description] [Features] [Reviews] [Buy Now]")
        elif page.kind == "item_sub":
            product = self.products[page.asin]
            lines += ["[Back to Search] [< Prev]"]
            if page.sub_page == "description":
                lines.append(f"Description: {product.description or 'None'}")
            elif page.sub_page == "features":
                lines += ["Features:"] + [f"- {f}" for f in product.features] if product.features else ["Features: None"]
            else:
                lines += ["Reviews:"] + [f"- {r}" for r in product.reviews] if product.reviews else ["Reviews: None yet."]
        return "\n".join(lines)

    def _invalid(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return f"Invalid action: {reason}\n\n{self._render()}", 0.0, False, False, self._info(action_valid=False)

    def admissible_actions(self) -> list[str]:
        if self._page.kind == "search":
            return [SEARCH_PLACEHOLDER]
        return [f"click[{label}]" for label, _ in self._buttons()]

    # -- expert --------------------------------------------------------------------------------

    def expert_query(self, goal: Goal) -> str:
        """The search the expert types: the goal's attributes and product type when that finds the
        gold product on the first page, else the gold title when that does, else whichever finds it."""
        if goal.id not in self._expert_queries:
            candidates = [" ".join([*goal.attributes, goal.query]).strip().lower(), " ".join(goal.name.lower().split())]
            candidates = [c for c in candidates if c]
            found = [c for c in candidates if goal.asin in self.search(c)]
            first_page = [c for c in found if goal.asin in self.search(c)[:RESULTS_PER_PAGE]]
            self._expert_queries[goal.id] = (first_page or found or candidates)[0]
        return self._expert_queries[goal.id]

    def _option_clicks(self, chosen: dict[str, str]) -> list[str]:
        product, chosen, clicks = self.products[self._goal.asin], dict(chosen), []
        for wanted in self._goal.options:
            match = best_option(product, wanted)
            if match is not None and chosen.get(match[0]) != match[1]:
                chosen[match[0]] = match[1]
                clicks.append(f"click[{match[1]}]")
        return clicks

    def _plan_from_results(self, query: str, page_number: int) -> list[str] | None:
        results = self.search(query)
        if self._goal.asin not in results:
            return None
        target = results.index(self._goal.asin) // RESULTS_PER_PAGE + 1
        turns = ["click[Next >]"] * (target - page_number) + ["click[< Prev]"] * (page_number - target)
        return [*turns, f"click[{self._goal.asin}]", *self._option_clicks({}), "click[Buy Now]"]

    def _plan_from_search(self) -> list[str]:
        query = self.expert_query(self._goal)
        return [f"search[{query}]", *(self._plan_from_results(query, 1) or [])]

    def expert_plan(self) -> list[str]:
        """The expert's remaining actions from the current page."""
        page = self._page
        if self._goal is None or page.kind == "done":
            return []
        if page.kind == "search":
            return self._plan_from_search()
        prefix = ["click[< Prev]"] if page.kind == "item_sub" else []
        if page.kind in ("item", "item_sub"):
            if page.asin == self._goal.asin:
                return [*prefix, *self._option_clicks(self._chosen), "click[Buy Now]"]
            prefix.append("click[< Prev]")  # back to the results
        from_results = self._plan_from_results(page.query, page.page_number)
        if from_results is None:
            return [*prefix, "click[Back to Search]", *self._plan_from_search()]
        return [*prefix, *from_results]

    def _privileged(self) -> str:
        goal = self._goal
        gold = self.products[goal.asin]
        plan = self._plan_from_search()
        bound = f"lower than ${goal.price_upper:.2f}" if goal.price_upper < 1_000_000 else "none"
        return "\n".join([
            f"Goal attributes: {', '.join(goal.attributes)}",
            f"Goal options: {', '.join(goal.options) or 'none'}",
            f"Price bound: {bound}",
            f"Gold product: [{gold.asin}] {gold.title} ({gold.price_tag})",
            f"Actions to buy it: {', '.join(plan)}",
        ])

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        goal = self._goal
        return {
            "task": goal.instruction,
            "admissible_actions": self.admissible_actions(),
            "action_valid": action_valid,
            "won": self._won,
            "score": self._score,
            "privileged": self._privileged(),
            "expert_plan": self.expert_plan(),
            "task_type": goal.category or None,
            "goal_id": goal.id,
            "page": self._page.kind,
            "reward_components": self._components,
        }
