"""WebShop's products and goals: a catalog generated offline from a seed, and the files on disk.

The original WebShop scrapes 1.18M Amazon products; none can be downloaded here, so the project
generates a catalog of the same shape: the original's five categories (beauty, food, fashion,
furniture, electronics), 40 product types with an Amazon-style category path, a search query, a
pool of attributes ("sulfate free", "non slip"), option dimensions (size, color, scent, flavor,
style) and a price range. Each product has an invented brand (unique per type, so titles are
unique), 3-5 attributes of its type, 2-5 values per option dimension, a price, features (bullet
points), a description and a few reviews. Every goal is drawn from one product (the gold product):
1-3 of its attributes, one value of each of its option dimensions, and a price bound chosen as the
original does (one of the next four multiples of 10 dollars above the price, the larger of two
drawn), so the gold product always satisfies it. Train and eval goals come from disjoint products.

Values are chosen so the original's fuzzy matching cannot confuse two options of one product or
two attributes of one product (their ``token_set_ratio`` is at most 85 after colour
normalization): the reward then tells choices apart as intended. The original data has no such
guarantee ("2 ounce (pack of 1)" fuzzily matches "3 ounce (pack of 1)").

Files (UTF-8 JSONL, in ``cache_dir()/webshop/seed{S}-n{N}-v{V}/``): ``products.jsonl``,
``train.jsonl`` and ``eval.jsonl`` (goals), ``corpus.jsonl`` (the search corpus: ``{"id": asin,
"title", "contents"}`` with title, category, attributes and description, the layout our retrieval
backends index) and ``meta.json``. Same seed and size, same bytes (randomness comes only from
``random.Random.random()``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentkit.envs.search_qa.corpus import _Names, _Rng, contents_of
from agentkit.envs.webshop.reward import FUZZY_THRESHOLD, normalize_color, token_set_ratio

from agentkit.core.errors import ConfigError
from agentkit.core.paths import build_folder_once, cache_dir

GENERATOR_VERSION = 1
DEFAULT_NUM_PRODUCTS = 3000
MIN_PRODUCTS, MAX_PRODUCTS = 100, 20_000
EVAL_FRACTION = 0.1
PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))  # the original's goal price bounds
PRODUCTS_FILE, CORPUS_FILE, META_FILE = "products.jsonl", "corpus.jsonl", "meta.json"
GENERATED_SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Product:
    """One product, with the fields the pages show and the reward reads."""

    asin: str
    title: str
    category: str  # the original's top-level category: beauty, food, fashion, furniture, electronics
    product_category: str  # "A › B › C"
    query: str  # the search query the product was scraped under (the type reward's query match)
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, its values), in page order
    price: float  # what buying costs (the reward's price)
    price_tag: str  # what the pages show ("$12.99", or "$10.0 to $20.0" for a range)
    description: str
    features: tuple[str, ...]
    reviews: tuple[str, ...] = ()
    rating: str = "N.A."

    def option_values(self) -> dict[str, str]:
        """Option value -> its option name (the first name, when two options share a value)."""
        found: dict[str, str] = {}
        for name, values in self.options:
            for value in values:
                found.setdefault(value, name)
        return found

    def search_contents(self) -> str:
        """The text the search engine indexes (after the title line)."""
        return " ".join([self.product_category, ", ".join(self.attributes), self.description])


@dataclass(frozen=True)
class Goal:
    """One shopping instruction and what satisfies it."""

    id: str
    asin: str  # the gold product
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]  # option values (human goals give values only)
    price_upper: float
    query: str  # the gold product's query, category path and title (the type reward)
    product_category: str
    name: str
    category: str


def product_from_record(record: dict[str, Any]) -> Product:
    return Product(**{**record, "attributes": tuple(record["attributes"]), "features": tuple(record["features"]),
                      "reviews": tuple(record["reviews"]),
                      "options": tuple((name, tuple(values)) for name, values in record["options"])})


def goal_from_record(record: dict[str, Any]) -> Goal:
    return Goal(**{**record, "attributes": tuple(record["attributes"]), "options": tuple(record["options"])})


# ---------------------------------------------------------------------------------------------
# the product types

_COLORS = ("black", "white", "navy blue", "grey", "red", "dark green", "pink", "beige", "brown", "purple", "teal",
           "mustard yellow", "olive", "burgundy", "ivory")
_CLOTHING = ("xs", "small", "medium", "large", "xl", "xxl")
_SHOES = ("us 6", "us 7", "us 8", "us 9", "us 10", "us 11", "us 12")
_VOLUME = ("2oz", "8oz", "16oz", "32oz")
_WEIGHT = ("100 gram", "half pound", "one pound", "two pound", "five pound")
_PACKS = ("single", "twin pack", "three pack", "six pack", "twelve pack")
_SCENTS = ("lavender", "unscented", "citrus", "vanilla", "eucalyptus mint", "coconut", "rose", "sandalwood")
_FLAVORS = ("chocolate", "vanilla", "strawberry", "salted caramel", "peanut butter", "original", "honey", "cinnamon")
_FURNITURE_SIZES = ("compact", "standard", "oversized")
_BED_SIZES = ("twin", "full", "queen", "king")
_CAPACITY = ("64gb", "128gb", "256gb", "512gb")
_CABLE = ("3ft", "6ft", "10ft")

# (category, query, type noun for titles, category path, attribute pool, option dims, price range)
_TYPES: tuple[tuple[str, str, str, str, tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...], tuple[float, float]], ...] = (
    ("beauty", "shampoo", "Shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
     ("sulfate free", "paraben free", "dry hair", "natural ingredients", "color safe", "anti dandruff", "vegan formula"),
     (("size", _VOLUME), ("scent", _SCENTS)), (6, 38)),
    ("beauty", "face moisturizer", "Face Moisturizer", "Beauty & Personal Care › Skin Care › Face › Moisturizers",
     ("sensitive skin", "fragrance free", "hyaluronic acid", "oil free", "anti aging", "spf protection"),
     (("size", _VOLUME),), (9, 60)),
    ("beauty", "lipstick", "Lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
     ("long lasting", "matte finish", "cruelty free", "moisturizing", "waterproof", "high pigment"),
     (("color", _COLORS),), (5, 28)),
    ("beauty", "hair extension", "Hair Extension", "Beauty & Personal Care › Hair Care › Extensions & Wigs › Extensions",
     ("clip in", "natural looking", "heat resistant", "human hair", "easy apply", "thick volume"),
     (("color", _COLORS), ("size", ("14 inch", "18 inch", "22 inch"))), (15, 90)),
    ("beauty", "nail polish", "Nail Polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Polish",
     ("quick dry", "chip resistant", "non toxic", "glossy finish", "gel effect"),
     (("color", _COLORS),), (4, 20)),
    ("beauty", "body wash", "Body Wash", "Beauty & Personal Care › Personal Care › Bath & Bathing › Body Washes",
     ("moisturizing", "dermatologist tested", "tea tree", "natural ingredients", "gentle cleansing"),
     (("scent", _SCENTS), ("size", _VOLUME)), (5, 25)),
    ("beauty", "deodorant", "Deodorant", "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants",
     ("aluminum free", "long lasting", "baking soda free", "travel size", "sensitive skin"),
     (("scent", _SCENTS), ("size", ("2oz", "3oz bar", "twin pack"))), (6, 22)),
    ("beauty", "makeup brush set", "Makeup Brush Set", "Beauty & Personal Care › Tools & Accessories › Makeup Brushes & Tools",
     ("synthetic bristles", "travel case", "cruelty free", "easy clean", "soft fibers"),
     (("color", _COLORS),), (8, 45)),
    ("food", "protein powder", "Protein Powder", "Grocery & Gourmet Food › Sports Nutrition › Protein Powders",
     ("gluten free", "plant based", "low sugar", "non gmo", "keto friendly", "soy free"),
     (("flavor", _FLAVORS), ("size", _WEIGHT)), (18, 70)),
    ("food", "granola", "Granola", "Grocery & Gourmet Food › Breakfast Foods › Cereals › Granola",
     ("gluten free", "whole grain", "low sugar", "organic", "high fiber", "nut free"),
     (("flavor", _FLAVORS), ("size", _PACKS)), (4, 30)),
    ("food", "green tea", "Green Tea", "Grocery & Gourmet Food › Beverages › Tea › Green Tea",
     ("organic", "caffeine free", "loose leaf", "individually wrapped", "antioxidant rich"),
     (("flavor", ("jasmine", "original", "mint", "lemon ginger", "honey")), ("size", _PACKS)), (5, 35)),
    ("food", "coffee beans", "Coffee Beans", "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
     ("dark roast", "fair trade", "single origin", "low acid", "organic", "medium roast"),
     (("size", _WEIGHT),), (9, 48)),
    ("food", "snack bars", "Snack Bars", "Grocery & Gourmet Food › Snacks & Sweets › Bars › Nutrition Bars",
     ("gluten free", "high protein", "low carb", "dairy free", "individually wrapped", "no added sugar"),
     (("flavor", _FLAVORS), ("size", _PACKS)), (6, 40)),
    ("food", "olive oil", "Olive Oil", "Grocery & Gourmet Food › Pantry Staples › Cooking Oils › Olive Oil",
     ("extra virgin", "cold pressed", "organic", "glass bottle", "first harvest"),
     (("size", _VOLUME),), (7, 45)),
    ("food", "dark chocolate", "Dark Chocolate", "Grocery & Gourmet Food › Snacks & Sweets › Chocolate › Dark Chocolate",
     ("dairy free", "fair trade", "low sugar", "gift box", "sea salt", "high cocoa"),
     (("flavor", ("original", "orange", "mint", "sea salt almond", "raspberry")), ("size", _PACKS)), (4, 32)),
    ("food", "herbal supplement", "Herbal Supplement", "Health & Household › Vitamins & Dietary Supplements › Herbal Supplements",
     ("non gmo", "vegan capsules", "gluten free", "third party tested", "easy swallow"),
     (("size", ("30 capsules", "60 capsules", "120 capsules")),), (8, 40)),
    ("fashion", "running shoes", "Running Shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
     ("non slip", "breathable mesh", "lightweight", "arch support", "rubber sole", "memory foam"),
     (("color", _COLORS), ("size", _SHOES)), (25, 120)),
    ("fashion", "rain jacket", "Rain Jacket", "Clothing, Shoes & Jewelry › Women › Clothing › Coats & Jackets",
     ("waterproof", "hooded", "packable", "machine wash", "windproof", "zip pockets"),
     (("color", _COLORS), ("size", _CLOTHING)), (28, 110)),
    ("fashion", "yoga pants", "Yoga Pants", "Clothing, Shoes & Jewelry › Women › Clothing › Active › Leggings",
     ("high waist", "tummy control", "moisture wicking", "four way stretch", "side pockets"),
     (("color", _COLORS), ("size", _CLOTHING)), (14, 55)),
    ("fashion", "crew socks", "Crew Socks", "Clothing, Shoes & Jewelry › Men › Clothing › Socks & Hosiery",
     ("cotton blend", "cushioned sole", "moisture wicking", "machine wash", "odor control"),
     (("color", _COLORS), ("size", ("small", "medium", "large")), ("style", _PACKS)), (7, 30)),
    ("fashion", "t-shirt", "T-Shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
     ("cotton", "relaxed fit", "machine wash", "short sleeve", "tagless"),
     (("color", _COLORS), ("size", _CLOTHING)), (8, 35)),
    ("fashion", "leather wallet", "Leather Wallet", "Clothing, Shoes & Jewelry › Men › Accessories › Wallets",
     ("genuine leather", "rfid blocking", "slim design", "gift box", "coin pocket"),
     (("color", _COLORS),), (12, 60)),
    ("fashion", "sun hat", "Sun Hat", "Clothing, Shoes & Jewelry › Women › Accessories › Hats & Caps › Sun Hats",
     ("wide brim", "upf protection", "packable", "adjustable strap", "straw weave"),
     (("color", _COLORS),), (10, 40)),
    ("fashion", "ankle boots", "Ankle Boots", "Clothing, Shoes & Jewelry › Women › Shoes › Boots › Ankle & Bootie",
     ("faux leather", "side zipper", "block heel", "non slip", "memory foam"),
     (("color", _COLORS), ("size", _SHOES)), (30, 110)),
    ("furniture", "office chair", "Office Chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
     ("lumbar support", "adjustable height", "mesh back", "swivel base", "easy assembly", "padded armrests"),
     (("color", _COLORS),), (60, 300)),
    ("furniture", "bookshelf", "Bookshelf", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
     ("solid wood", "easy assembly", "five tier", "space saving", "anti tip"),
     (("color", _COLORS), ("size", _FURNITURE_SIZES)), (40, 220)),
    ("furniture", "coffee table", "Coffee Table", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
     ("storage shelf", "solid wood", "tempered glass", "easy assembly", "mid century"),
     (("color", _COLORS), ("size", _FURNITURE_SIZES)), (50, 260)),
    ("furniture", "bed frame", "Bed Frame", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases",
     ("metal platform", "under bed storage", "noise free", "headboard included", "easy assembly"),
     (("size", _BED_SIZES), ("color", _COLORS)), (90, 400)),
    ("furniture", "bar stool", "Bar Stool", "Home & Kitchen › Furniture › Kitchen & Dining Room Furniture › Stools",
     ("adjustable height", "swivel seat", "footrest", "faux leather", "set of two"),
     (("color", _COLORS),), (35, 180)),
    ("furniture", "floor lamp", "Floor Lamp", "Home & Kitchen › Lighting › Floor Lamps",
     ("dimmable", "energy efficient", "remote control", "linen shade", "reading light"),
     (("color", _COLORS),), (30, 150)),
    ("furniture", "shoe rack", "Shoe Rack", "Home & Kitchen › Storage & Organization › Clothing & Closet Storage › Shoe Organizers",
     ("space saving", "stackable", "bamboo", "easy assembly", "four tier"),
     (("color", _COLORS), ("size", _FURNITURE_SIZES)), (18, 80)),
    ("furniture", "accent chair", "Accent Chair", "Home & Kitchen › Furniture › Living Room Furniture › Chairs",
     ("velvet upholstery", "wooden legs", "high back", "easy assembly", "tufted"),
     (("color", _COLORS),), (70, 320)),
    ("electronics", "wireless earbuds", "Wireless Earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbud Headphones",
     ("noise cancelling", "bluetooth", "long battery life", "water resistant", "charging case", "built in microphone"),
     (("color", _COLORS),), (18, 150)),
    ("electronics", "phone case", "Phone Case", "Electronics › Cell Phones & Accessories › Cases, Holsters & Sleeves",
     ("shockproof", "slim design", "wireless charging compatible", "kickstand", "raised edges"),
     (("color", _COLORS), ("style", ("clear", "rugged", "wallet"))), (6, 35)),
    ("electronics", "usb c cable", "USB C Cable", "Electronics › Computers & Accessories › Cables › USB Cables",
     ("fast charging", "braided nylon", "data transfer", "tangle free"),
     (("size", _CABLE), ("color", _COLORS), ("style", _PACKS)), (5, 25)),
    ("electronics", "bluetooth speaker", "Bluetooth Speaker", "Electronics › Portable Audio & Video › Portable Speakers",
     ("waterproof", "long battery life", "deep bass", "built in microphone", "hands free"),
     (("color", _COLORS),), (20, 140)),
    ("electronics", "memory card", "Memory Card", "Electronics › Computers & Accessories › Memory Cards › Micro SD Cards",
     ("high speed", "adapter included", "4k video", "shock proof"),
     (("size", _CAPACITY),), (8, 70)),
    ("electronics", "wireless mouse", "Wireless Mouse", "Electronics › Computers & Accessories › Keyboards, Mice & Accessories › Mice",
     ("ergonomic", "silent click", "rechargeable", "usb receiver", "adjustable dpi"),
     (("color", _COLORS),), (10, 60)),
    ("electronics", "smart watch", "Smart Watch", "Electronics › Wearable Technology › Smartwatches",
     ("heart rate monitor", "sleep tracking", "water resistant", "long battery life", "gps"),
     (("color", _COLORS), ("size", ("40mm", "44mm"))), (40, 260)),
    ("electronics", "hdmi cable", "HDMI Cable", "Electronics › Television & Video › Accessories › Cables › HDMI Cables",
     ("high speed", "4k video", "gold plated", "braided nylon"),
     (("size", _CABLE), ("style", _PACKS)), (6, 30)),
)

_TITLE_WORDS = ("Premium", "Classic", "Essential", "Everyday", "Pro", "Ultra", "Signature", "Original", "Deluxe", "Pure")
_REVIEWS = (
    "Exactly as described, would buy again.", "Good value for the price.", "Arrived quickly and works well.",
    "Quality is fine but the packaging was damaged.", "Not what I expected, returned it.",
    "My second one; still happy with it.", "Does the job.",
)


def _distinct(rng: _Rng, pool: Iterable[str], count: int, taken: list[str]) -> list[str]:
    """Up to ``count`` values from ``pool`` (random order) that the original's fuzzy matching
    tells apart from each other and from ``taken``."""
    pool = list(pool)
    candidates = list(pool)
    rng.shuffle(candidates)
    chosen: list[str] = []
    for value in candidates:
        if len(chosen) == count:
            break
        if all(_apart(value, other) for other in (*taken, *chosen)):
            chosen.append(value)
    order = {value: i for i, value in enumerate(pool)}
    return sorted(chosen, key=order.__getitem__)  # page order: as the pool lists them (sizes ascending)


def _apart(a: str, b: str) -> bool:
    """The reward's fuzzy matching (with and without colour normalization) tells a and b apart."""
    return max(token_set_ratio(a, b), token_set_ratio(normalize_color(a), normalize_color(b))) <= FUZZY_THRESHOLD


def _asin(rng: _Rng, used: set[str]) -> str:
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _sentence(attribute: str, noun: str) -> str:
    return f"{attribute.capitalize()}: this {noun.lower()} is {attribute}."


def _product(rng: _Rng, kind: tuple, brand: str, asin: str) -> Product:
    category, query, noun, path, pool, dims, (low, high) = kind
    attributes = _distinct(rng, pool, rng.between(3, min(5, len(pool))), [])
    options: list[tuple[str, tuple[str, ...]]] = []
    taken: list[str] = []
    for name, values in dims:
        chosen = _distinct(rng, values, rng.between(2, min(5, len(values))), taken)
        taken.extend(chosen)
        options.append((name, tuple(chosen)))
    price = rng.between(int(low), int(high)) - 0.01  # shop prices end in .99
    shown = rng.sample(attributes, min(2, len(attributes)))
    title = f"{brand} {rng.choice(_TITLE_WORDS)} {noun}, {', '.join(a.title() for a in shown)}"
    description = (f"The {brand} {noun.lower()} is made for everyday use. It is {', '.join(attributes[:-1])} "
                   f"and {attributes[-1]}. " + rng.choice(("Backed by a one year warranty.", "Ships in recyclable packaging.",
                                                            "Designed and tested by our team.", "A customer favourite.")))
    features = tuple(_sentence(a, noun) for a in attributes)
    reviews = tuple(rng.sample(_REVIEWS, rng.between(0, 3)))
    rating = f"{rng.between(30, 50) / 10:.1f}" if reviews else "N.A."
    return Product(asin=asin, title=title, category=category, product_category=path, query=query,
                   attributes=tuple(attributes), options=tuple(options), price=price, price_tag=f"${price:.2f}",
                   description=description, features=features, reviews=reviews, rating=rating)


def price_bound(rng: _Rng, price: float) -> float | None:
    """The original's goal price bound: the larger of two of the next four multiples of 10 above
    the price; None when fewer than two remain (the original then sets no bound)."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return None
    return max(rng.sample(above, 2))


_TEMPLATES = (
    "i am looking for {a} {noun}{opts}",
    "i need {a} {noun}{opts}",
    "find me {a} {noun}{opts}",
    "i want to buy {a} {noun}{opts}",
    "i'm searching for {a} {noun}{opts}",
)


def _article(text: str) -> str:
    return ("an " if text[0] in "aeiou" else "a ") + text


def _goal(rng: _Rng, product: Product, goal_id: str) -> Goal:
    attributes = rng.sample(product.attributes, rng.between(1, min(3, len(product.attributes))))
    chosen = [(name, rng.choice(values)) for name, values in product.options]
    attr_text = " and ".join(attributes)
    opts = ""
    if chosen:
        parts = [f"{value} {name}" if name in ("color", "scent", "flavor", "style") else f"size {value}"
                 for name, value in chosen]
        opts = ", in " + " and ".join(parts)
    bound = price_bound(rng, product.price)
    price_text = f", and price lower than {bound:.2f} dollars" if bound is not None else ""
    instruction = rng.choice(_TEMPLATES).format(a=_article(attr_text), noun=product.query, opts=opts)
    return Goal(id=goal_id, asin=product.asin, instruction=instruction + price_text, attributes=tuple(attributes),
                options=tuple(value for _, value in chosen), price_upper=bound if bound is not None else 1_000_000.0,
                query=product.query, product_category=product.product_category, name=product.title,
                category=product.category)


@dataclass(frozen=True)
class GeneratedCatalog:
    products: list[Product]
    splits: dict[str, list[Goal]]
    meta: dict[str, Any]


def generate(seed: int = 0, num_products: int = DEFAULT_NUM_PRODUCTS) -> GeneratedCatalog:
    """Products and goal splits in memory, deterministic in ``seed`` and ``num_products``."""
    _check_args(seed, num_products)
    rng = _Rng(seed)
    names = _Names(rng)
    per_type = [num_products // len(_TYPES) + (i < num_products % len(_TYPES)) for i in range(len(_TYPES))]
    brands = [names.new((2, 3)) for _ in range(max(per_type))]
    used: set[str] = set()
    products = []
    for kind, count in zip(_TYPES, per_type, strict=True):
        for brand in rng.sample(brands, count):  # a brand makes one product per type: titles are unique
            products.append(_product(rng, kind, brand, _asin(rng, used)))
    rng.shuffle(products)
    order = list(range(len(products)))
    rng.shuffle(order)
    n_eval = max(1, round(len(products) * EVAL_FRACTION))
    splits: dict[str, list[Goal]] = {"eval": [], "train": []}
    seen: set[str] = set()
    for split, indices in (("eval", order[:n_eval]), ("train", order[n_eval:])):
        for i in indices:
            for _ in range(20):  # two products of a type may draw the same instruction: draw again
                goal = _goal(rng, products[i], f"{split}-{len(splits[split]):05d}")
                if goal.instruction not in seen:
                    seen.add(goal.instruction)
                    splits[split].append(goal)
                    break
    meta = {"generator_version": GENERATOR_VERSION, "seed": seed, "num_products": len(products),
            "num_goals": {split: len(goals) for split, goals in splits.items()}}
    return GeneratedCatalog(products, splits, meta)


def _check_args(seed: int, num_products: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"catalog seed must be a non-negative integer, got {seed!r}.")
    if isinstance(num_products, bool) or not isinstance(num_products, int) or not MIN_PRODUCTS <= num_products <= MAX_PRODUCTS:
        raise ConfigError(f"num_products must be an integer from {MIN_PRODUCTS} to {MAX_PRODUCTS}, got {num_products!r}.")


# ---------------------------------------------------------------------------------------------
# files


def _jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def corpus_records(products: Iterable[Product]) -> Iterator[dict[str, str]]:
    """The search corpus: one document per product, in the layout our retrieval backends read."""
    for p in products:
        yield {"id": p.asin, "title": p.title, "contents": contents_of(p.title, p.search_contents())}


def write_catalog(folder: Path, products: list[Product], splits: dict[str, list[Goal]], meta: dict[str, Any]) -> None:
    """Write products, goal splits, the search corpus and ``meta.json`` (with checksums) into ``folder``."""
    payloads = {PRODUCTS_FILE: _jsonl_bytes(asdict(p) for p in products), CORPUS_FILE: _jsonl_bytes(corpus_records(products))}
    for split, goals in splits.items():
        payloads[f"{split}.jsonl"] = _jsonl_bytes(asdict(g) for g in goals)
    meta = {**meta, "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}}
    payloads[META_FILE] = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode("utf-8")
    for name, data in payloads.items():
        (folder / name).write_bytes(data)


def generated_dir(seed: int = 0, num_products: int = DEFAULT_NUM_PRODUCTS) -> Path:
    """The cache folder of one generated catalog, created (atomically) on first use."""
    _check_args(seed, num_products)
    folder = cache_dir() / "webshop" / f"seed{seed}-n{num_products}-v{GENERATOR_VERSION}"
    if (folder / META_FILE).exists():
        return folder
    with build_folder_once(folder, META_FILE) as tmp:
        catalog = generate(seed, num_products)
        write_catalog(tmp, catalog.products, catalog.splits, catalog.meta)
    return folder


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"Cannot read {path}: {err}") from err
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{lineno} is not valid JSON ({err.msg}); delete the folder to regenerate it.") from err


def read_catalog(folder: Path, split: str) -> tuple[list[Product], list[Goal]]:
    """Products and one split's goals from a catalog folder."""
    goals_path = folder / f"{split}.jsonl"
    if not goals_path.is_file():
        splits = sorted(p.stem for p in folder.glob("*.jsonl") if p.name not in (PRODUCTS_FILE, CORPUS_FILE))
        raise ConfigError(f"The WebShop catalog in {folder} has no split {split!r}; it has {splits}.")
    products = [product_from_record(r) for r in _read_jsonl(folder / PRODUCTS_FILE)]
    goals = [goal_from_record(r) for r in _read_jsonl(goals_path)]
    if not goals:
        raise ConfigError(f"Split {split!r} of the WebShop catalog in {folder} holds no goals.")
    return products, goals
