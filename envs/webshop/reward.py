"""WebShop's reward (Yao et al. 2022, ``web_agent_site/engine/goal.py:get_reward``), dependency-free.

For a bought product and a goal::

    r = r_type * (attributes matched + options matched + price_ok) / (|attributes| + |options| + 1)

- attribute match: a goal attribute counts when some product attribute has a fuzzy
  ``token_set_ratio`` above 85 with it, or when it occurs in the title, the features (bullet
  points) or the description (lowercased substring), as in the original;
- option match: a goal option counts when some chosen option value, both colour-normalized, has a
  ``token_set_ratio`` above 85 with it;
- price: 1 when the product's price is at most the goal's bound;
- type: 1.0 when the query or at least two category levels match or the title score exceeds 0.2,
  else 0.5; 0.1 when the title score is below 0.1; 0.0 when it is 0. The title score is the share
  of the goal title's nouns that the bought title contains.

Departures from the original, each because of a dependency we do not take:

- ``token_set_ratio`` is thefuzz's (token sets, sorted intersection and remainders, best pairwise
  ratio) with the ratio computed as rapidfuzz does, ``100 * 2 * LCS / (len_a + len_b)`` (the
  normalized Indel similarity), rounded to an integer; no thefuzz/rapidfuzz needed.
- The title score's "nouns" come from spaCy's part-of-speech tagger in the original; here they
  are the title's alphabetic words of 3+ letters that are not stopwords or colour words, an
  approximation that needs no language model. Buying the goal's own product still scores 1.
- Colour normalization matches colour names as whole words ("standard" does not become "tan",
  which the original's substring test does).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FUZZY_THRESHOLD = 85  # a fuzzy match needs a token_set_ratio above this (the original's constant)
NO_PRICE_BOUND = 1_000_000.0  # the original's price_upper when a goal has no bound

# the original's web_agent_site/utils normalize.py colour list
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
    "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
    "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
    "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
    "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)
_COLOR_WORDS = frozenset(COLOR_SET)

_STOPWORDS = frozenset("""
a an and are as at be by for from has have in into is it its of on or that the this to with without
pack count set size inch inches ounce ounces oz fl lb lbs pcs piece pieces new women men womens mens
""".split())
_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_WORDS = re.compile(r"[a-z]+")


def _process(text: str) -> str:
    """thefuzz's ``full_process``: lowercase, non-alphanumerics to spaces, trimmed."""
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def _lcs_length(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for ch in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if ch == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def ratio(a: str, b: str) -> float:
    """Normalized Indel similarity in [0, 100] (rapidfuzz's ``fuzz.ratio``); two empty strings give 0."""
    total = len(a) + len(b)
    if not total:
        return 0.0
    return 100.0 * 2 * _lcs_length(a, b) / total


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio``: 100 when one side's word set contains the other's."""
    tokens_a, tokens_b = set(_process(a).split()), set(_process(b).split())
    if not tokens_a or not tokens_b:
        return 0
    common = " ".join(sorted(tokens_a & tokens_b))
    rest_a = " ".join(sorted(tokens_a - tokens_b))
    rest_b = " ".join(sorted(tokens_b - tokens_a))
    combined_a = f"{common} {rest_a}".strip()
    combined_b = f"{common} {rest_b}".strip()
    return round(max(ratio(common, combined_a), ratio(common, combined_b), ratio(combined_a, combined_b)))


def normalize_color(text: str) -> str:
    """The first colour of ``COLOR_SET`` (list order) named as a word in ``text``, else ``text``."""
    words = set(_WORDS.findall(text.lower()))
    for color in COLOR_SET:
        if color in words:
            return color
    return text


def title_nouns(title: str) -> list[str]:
    """The content words of a product title, the stand-in for spaCy's nouns (see the module doc)."""
    return [w for w in _WORDS.findall(title.lower()) if len(w) >= 3 and w not in _STOPWORDS and w not in _COLOR_WORDS]


@dataclass(frozen=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


def type_reward(*, bought_query: str, bought_category: str, bought_title: str,
                goal_query: str, goal_category: str, goal_title: str) -> TypeReward:
    """Whether the bought product is the goal's kind of product (``get_type_reward``)."""
    query_match = bought_query.strip().lower() == goal_query.strip().lower()
    bought_levels = {level.strip() for level in bought_category.split("›")} - {""}
    goal_levels = {level.strip() for level in goal_category.split("›")} - {""}
    category_match = len(bought_levels & goal_levels) >= 2
    bought_nouns, goal_nouns = set(title_nouns(bought_title)), title_nouns(goal_title)
    title_score = len(bought_nouns & set(goal_nouns)) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(goal_attributes: Sequence[str], *, attributes: Iterable[str], title: str,
                      features: Iterable[str], description: str) -> int:
    """How many goal attributes the product has (``get_attribute_reward``'s count)."""
    attributes = list(attributes)
    text_fields = (title.lower(), " ".join(features).lower(), description.lower())
    matched = 0
    for goal_attribute in goal_attributes:
        if any(token_set_ratio(a, goal_attribute) > FUZZY_THRESHOLD for a in attributes):
            matched += 1
        elif any(goal_attribute.lower() in field for field in text_fields):
            matched += 1
    return matched


def option_matches(goal_options: Sequence[str], chosen_options: Iterable[str]) -> int:
    """How many goal options the chosen option values hit (``get_option_reward``'s count)."""
    chosen = [normalize_color(o) for o in chosen_options]
    return sum(
        any(token_set_ratio(c, normalize_color(g)) > FUZZY_THRESHOLD for c in chosen) for g in goal_options
    )


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one purchase and its parts (``info["reward_components"]``)."""

    total: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    attribute_matches: int
    num_attributes: int
    r_attribute: float | None
    option_matches: int
    num_options: int
    r_option: float | None
    r_price: bool
    price: float
    price_upper: float


def reward(*, goal_attributes: Sequence[str], goal_options: Sequence[str], price_upper: float,
           goal_query: str, goal_category: str, goal_title: str,
           bought_attributes: Iterable[str], bought_title: str, bought_features: Iterable[str],
           bought_description: str, bought_query: str, bought_category: str, price: float,
           chosen_options: Iterable[str]) -> RewardBreakdown:
    """The original's ``get_reward`` for buying a product with ``chosen_options`` at ``price``."""
    kind = type_reward(bought_query=bought_query, bought_category=bought_category, bought_title=bought_title,
                       goal_query=goal_query, goal_category=goal_category, goal_title=goal_title)
    n_attr = attribute_matches(goal_attributes, attributes=bought_attributes, title=bought_title,
                               features=bought_features, description=bought_description)
    n_opt = option_matches(goal_options, chosen_options)
    price_ok = price <= price_upper
    total = (n_attr + n_opt + int(price_ok)) / (len(goal_attributes) + len(goal_options) + 1) * kind.r_type
    return RewardBreakdown(
        total=total, r_type=kind.r_type, query_match=kind.query_match, category_match=kind.category_match,
        title_score=kind.title_score, attribute_matches=n_attr, num_attributes=len(goal_attributes),
        r_attribute=n_attr / len(goal_attributes) if goal_attributes else None,
        option_matches=n_opt, num_options=len(goal_options),
        r_option=n_opt / len(goal_options) if goal_options else None,
        r_price=price_ok, price=price, price_upper=price_upper,
    )
