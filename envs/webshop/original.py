"""The original WebShop data files, read into our ``Product``/``Goal`` shapes when a user has them.

Point ``data_dir`` at a folder holding the files of WebShop's ``setup.sh`` (``data/``):

- products: ``items_shuffle.json`` (or ``items_shuffle_1000.json``), a list of ``{"asin", "name",
  "category", "query", "product_category", "full_description", "small_description", "pricing",
  "customization_options": {name: [{"value", "image"}, ...] | null}, ...}``;
- attributes: ``items_ins_v2.json`` (or ``items_ins_v2_1000.json``), ``{asin: {"attributes": [...],
  "instruction": "...", "instruction_attributes": [...]}}``;
- human instructions: ``items_human_ins.json``, ``{asin: [{"instruction", "instruction_attributes",
  "instruction_options"}, ...]}``.

This follows ``web_agent_site/engine/engine.py:load_products`` and ``goal.py:get_human_goals`` /
``get_synthetic_goals``: option values lowercased with ``/`` as `` | ``, a price range sampled
uniformly (the pages show the range), goals without attributes skipped, price bounds from
``PRICE_RANGE``, goals shuffled with seed 233 and split into test (first 500), eval (next 1000) and
train (the rest). Departures: the original draws prices and bounds from Python's global random
state; here each is drawn from a generator seeded by the product's asin (and the goal's index), so
every process gets the same catalog. Files with fewer goals split in the same proportions (a
tenth test, a fifth eval) so that small files still have all three splits.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from pathlib import Path
from typing import Any

from agentkit.envs.search_qa.corpus import _Rng
from agentkit.envs.webshop.catalog import META_FILE, Goal, Product, price_bound, write_catalog

from agentkit.core.errors import ConfigError
from agentkit.core.paths import build_folder_once, cache_dir

ORIGINAL_SPLITS = ("train", "eval", "test")
GOAL_SOURCES = ("human", "synthetic")
LOADER_VERSION = 1
_PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
_ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
_HUMAN_FILE = "items_human_ins.json"


def _find(folder: Path, names: tuple[str, ...], what: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"WebShop data_dir {folder} has no {what} file (looked for {', '.join(names)}); "
                      "it is the data/ folder of WebShop's setup.sh.")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"Cannot read the WebShop file {path}: {err}") from err


def _seed(*parts: object) -> int:
    """A seed from strings, the same in every process (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def _pricing(raw: Any) -> list[float]:
    if not isinstance(raw, str) or not raw.strip():
        return [100.0]
    prices = []
    for piece in raw.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", piece)
        try:
            prices.append(float(digits))
        except ValueError:
            continue
    return prices[:2] or [100.0]


def _product(raw: dict[str, Any], attributes: dict[str, Any]) -> Product:
    asin = raw["asin"]
    pricing = _pricing(raw.get("pricing"))
    if len(pricing) == 1:
        price, tag = pricing[0], f"${pricing[0]}"
    else:
        low, high = pricing
        price, tag = random.Random(_seed("price", asin)).uniform(low, high), f"${low} to ${high}"
    options = []
    for name, contents in (raw.get("customization_options") or {}).items():
        if not contents:
            continue
        values = tuple(str(c["value"]).strip().replace("/", " | ").lower() for c in contents if isinstance(c, dict) and "value" in c)
        if values:
            options.append((str(name).lower(), values))
    bullets = raw.get("small_description")
    features = tuple(str(b) for b in bullets) if isinstance(bullets, list) else ((str(bullets),) if bullets else ())
    attrs = (attributes.get(asin) or {}).get("attributes") or ["DUMMY_ATTR"]
    return Product(asin=asin, title=str(raw.get("name") or ""), category=str(raw.get("category") or ""),
                   product_category=str(raw.get("product_category") or ""), query=str(raw.get("query") or "").lower().strip(),
                   attributes=tuple(str(a) for a in attrs), options=tuple(options), price=price, price_tag=tag,
                   description=str(raw.get("full_description") or ""), features=features)


def _goal(product: Product, instruction: str, attributes: list[str], options: list[str], key: str) -> Goal:
    bound = price_bound(_Rng(_seed("goal", key)), product.price)
    price_text = f", and price lower than {bound:.2f} dollars" if bound is not None else ""
    return Goal(id=key, asin=product.asin, instruction=instruction.strip().strip(".") + price_text,
                attributes=tuple(attributes), options=tuple(options),
                price_upper=bound if bound is not None else 1_000_000.0, query=product.query,
                product_category=product.product_category, name=product.title, category=product.category)


def load_original(data_dir: Path, goals: str = "human") -> tuple[list[Product], dict[str, list[Goal]]]:
    """Products and the train/eval/test goal splits from the original files in ``data_dir``."""
    if goals not in GOAL_SOURCES:
        raise ConfigError(f"goals must be one of {list(GOAL_SOURCES)}, got {goals!r}.")
    raw_products = _load_json(_find(data_dir, _PRODUCT_FILES, "products (items_shuffle)"))
    attributes = _load_json(_find(data_dir, _ATTRIBUTE_FILES, "attributes (items_ins_v2)"))
    human = _load_json(_find(data_dir, (_HUMAN_FILE,), "human instructions")) if goals == "human" else {}
    if not isinstance(raw_products, list) or not isinstance(attributes, dict) or not isinstance(human, dict):
        raise ConfigError(f"The WebShop files in {data_dir} do not have the original's layout (a list of products, "
                          "dicts keyed by asin for attributes and human instructions).")
    products: list[Product] = []
    seen: set[str] = set()
    for raw in raw_products:
        asin = raw.get("asin") if isinstance(raw, dict) else None
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue  # the original's filter
        seen.add(asin)
        products.append(_product(raw, attributes))
    goal_list: list[Goal] = []
    for product in products:
        if goals == "human":
            for i, ins in enumerate(human.get(product.asin) or []):
                attrs = ins.get("instruction_attributes") or []
                if not attrs or not isinstance(ins.get("instruction"), str):
                    continue
                goal_list.append(_goal(product, ins["instruction"], list(attrs), list(ins.get("instruction_options") or []),
                                       f"{product.asin}-h{i}"))
            continue
        record = attributes.get(product.asin) or {}
        if not record.get("instruction") or not record.get("instruction_attributes"):
            continue
        names = sorted(name for name, _ in product.options)
        values = dict(product.options)
        for j, combination in enumerate(itertools.product(*(values[n] for n in names))):
            option_text = ", and ".join(f"{n}: {v}" for n, v in zip(names, combination, strict=True))
            text = record["instruction"].strip().strip(".") + (f" with {option_text}" if option_text else "")
            goal_list.append(_goal(product, text, list(record["instruction_attributes"]), list(combination),
                                   f"{product.asin}-s{j}"))
    if not goal_list:
        raise ConfigError(f"The WebShop files in {data_dir} give no {goals} goals (no instruction with attributes).")
    _Rng(_seed("split", 233)).shuffle(goal_list)
    n = len(goal_list)
    n_test, n_eval = min(500, n // 10), min(1000, n // 5)
    splits = {"test": goal_list[:n_test], "eval": goal_list[n_test:n_test + n_eval], "train": goal_list[n_test + n_eval:]}
    return products, splits


def original_dir(data_dir: str | Path, goals: str = "human") -> Path:
    """A cache folder holding the original files converted to our catalog layout (built once per
    data_dir and file versions), so the retrieval index and workers share one copy."""
    data_dir = Path(data_dir).expanduser().resolve()
    if not data_dir.is_dir():
        raise ConfigError(f"WebShop data_dir {data_dir} is not a folder.")
    sources = [data_dir / name for name in (*_PRODUCT_FILES, *_ATTRIBUTE_FILES, _HUMAN_FILE) if (data_dir / name).is_file()]
    stamp = "|".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sources)
    key = hashlib.sha256(f"{LOADER_VERSION}|{goals}|{stamp}".encode()).hexdigest()[:16]
    folder = cache_dir() / "webshop" / f"original-{goals}-{key}"
    if (folder / META_FILE).exists():
        return folder
    products, splits = load_original(data_dir, goals)
    with build_folder_once(folder, META_FILE) as tmp:
        meta = {"loader_version": LOADER_VERSION, "data_dir": str(data_dir), "goals": goals, "num_products": len(products),
                "num_goals": {split: len(g) for split, g in splits.items()}}
        write_catalog(tmp, products, splits, meta)
    return folder
