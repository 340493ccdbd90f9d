"""``shop``: a WebShop-like store in text, generated per seed.

The instruction names a product type, attributes, option values and a price bound. The agent
searches (choosing among a few offered queries), pages through ranked results, opens items,
chooses options and buys. Buying ends the episode, right or wrong, so a careless policy fails
*quickly*: most failures are shorter than successes, the weak or reversed expansion–outcome
coupling of WebShop (docs/math.md#worked-example), unlike ``household``. ``reward="score"`` gives WebShop-style
partial credit, so outcomes are not binary.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from .base import DrawnEnv, Effect, Info
from .sampling import between, pick, sample, shuffle

Reward = Literal["score", "success"]
Distractors = Literal["few", "many", "mixed"]
Buy = Literal["anytime", "after_options"]
Page = Literal["search", "results", "item"]


@dataclass(frozen=True)
class ShopOptions:
    """Knobs of ``shop`` (docs/envs.md has their measured effect on coupling).

    * ``max_steps``: step cap, reached only by policies that wander without buying. It decides
      the sign of the coupling: at 15, those wanderers make failures about as long as successes
      on average; with 30, nearly every failure is a quick wrong purchase (ratio about 0.8).
    * ``reward``: ``"score"`` (partial credit in [0, 1]) or ``"success"`` (1 only for an exact
      match). ``won`` is the exact match either way.
    * ``catalogue_size``: items in the store; more items, longer result lists for broad queries.
    * ``distractors``: near-miss items (the right type, wrong in exactly one respect: an
      attribute, an option not offered, or the price) that a careful shopper has to open and
      reject; ``many`` (4) lengthens the expert's path, ``few`` (1). ``mixed`` draws per seed.
    * ``buy``: ``"anytime"`` (WebShop: ``buy`` on every item page, so a wrong path dead-ends in a
      quick wrong purchase) or ``"after_options"`` (``buy`` only once every option of the item
      is chosen, so wrong paths loop until the cap: failures get longer than successes).
    """

    max_steps: int = field(default=15, metadata={"min": 1})
    reward: Reward = "score"
    catalogue_size: int = field(default=30, metadata={"min": 20})
    distractors: Distractors = "mixed"
    buy: Buy = "anytime"


@dataclass(frozen=True)
class ProductType:
    name: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]  # option values are unique within a type
    price: tuple[int, int]
    brands: tuple[str, ...]


PRODUCT_TYPES = (
    ProductType(
        "t-shirt",
        ("cotton", "slim fit", "machine wash", "short sleeve", "long sleeve", "v-neck"),
        {
            "size": ("small", "medium", "large", "x-large"),
            "color": ("black", "white", "navy", "red"),
        },
        (8, 35),
        ("Hanes", "Gildan", "Comfort Colors", "Amazon Essentials"),
    ),
    ProductType(
        "running shoes",
        ("lightweight", "breathable", "non slip", "memory foam", "wide toe box", "waterproof"),
        {
            "size": ("size 7", "size 8", "size 9", "size 10", "size 11"),
            "color": ("black", "white", "grey", "blue"),
        },
        (30, 120),
        ("Brooks", "Asics", "Saucony", "New Balance"),
    ),
    ProductType(
        "hair extension",
        ("clip in", "natural looking", "heat resistant", "human hair", "straight", "wavy"),
        {
            "color": ("natural black", "dark brown", "blonde", "auburn"),
            "length": ("16 inch", "20 inch", "24 inch"),
        },
        (15, 80),
        ("Goo Goo", "Hairro", "Sassina", "Full Shine"),
    ),
    ProductType(
        "coffee maker",
        (
            "programmable",
            "single serve",
            "stainless steel",
            "thermal carafe",
            "auto shut off",
            "compact",
        ),
        {
            "capacity": ("4 cup", "8 cup", "12 cup"),
            "color": ("black", "silver", "red"),
        },
        (20, 150),
        ("Mr. Coffee", "Cuisinart", "Hamilton Beach", "Keurig"),
    ),
    ProductType(
        "phone case",
        (
            "shockproof",
            "slim",
            "wireless charging compatible",
            "transparent",
            "magnetic",
            "kickstand",
        ),
        {
            "model": ("iphone 14", "iphone 15", "galaxy s23", "pixel 8"),
            "color": ("black", "clear", "blue", "pink"),
        },
        (8, 30),
        ("Spigen", "OtterBox", "ESR", "Caseology"),
    ),
    ProductType(
        "headphones",
        (
            "wireless",
            "noise cancelling",
            "over ear",
            "long battery life",
            "foldable",
            "with microphone",
        ),
        {
            "color": ("black", "white", "blue", "rose gold"),
        },
        (25, 200),
        ("Sony", "Anker", "JBL", "Bose"),
    ),
    ProductType(
        "yoga mat",
        (
            "non slip",
            "extra thick",
            "eco friendly",
            "with carrying strap",
            "lightweight",
            "sweat resistant",
        ),
        {
            "thickness": ("1/4 inch", "1/2 inch"),
            "color": ("purple", "black", "teal", "pink"),
        },
        (15, 60),
        ("Gaiam", "Manduka", "BalanceFrom", "Retrospec"),
    ),
    ProductType(
        "face moisturizer",
        ("fragrance free", "for sensitive skin", "spf 30", "hyaluronic acid", "oil free", "vegan"),
        {
            "size": ("1.7 oz", "3.4 oz", "8 oz"),
        },
        (10, 45),
        ("CeraVe", "Neutrogena", "Cetaphil", "Olay"),
    ),
    ProductType(
        "dog bed",
        ("orthopedic", "washable cover", "waterproof", "calming", "non slip bottom", "memory foam"),
        {
            "size": ("small", "medium", "large", "x-large"),
            "color": ("grey", "brown", "beige"),
        },
        (25, 90),
        ("Furhaven", "Bedsure", "Best Friends", "PetFusion"),
    ),
    ProductType(
        "backpack",
        (
            "water resistant",
            "laptop compartment",
            "lightweight",
            "anti theft",
            "usb charging port",
            "padded straps",
        ),
        {
            "color": ("black", "navy", "grey", "green"),
            "capacity": ("20l", "30l", "40l"),
        },
        (20, 80),
        ("Osprey", "JanSport", "Matein", "Samsonite"),
    ),
)

PAGE_SIZE = 5
EXPERT_STEP_BOUND = 7
"""Stores whose exact match the expert cannot buy within this many steps are redrawn."""
_NEAR_MISSES = {"few": 1, "many": 4}
_SAME_TYPE_SHARE = 0.2  # of the filler items
_ASIN_SPACE, _ASIN_STRIDE = 16**8, 0x9E3779B1  # an odd stride gives distinct ids


class Item:
    """A product. Its price, offered option values and brand are decoded from a random
    ``code`` the first time they are needed: most items of a store are never shown, and drawing
    them all up front was most of the cost of ``reset``."""

    __slots__ = ("asin", "type", "attributes", "popularity", "_code", "_required", "_details")

    def __init__(
        self,
        asin: str,
        ptype: ProductType,
        attributes: tuple[str, ...],
        popularity: float,
        code: int,
        required: dict[str, str],
    ) -> None:
        self.asin, self.type, self.attributes, self.popularity = asin, ptype, attributes, popularity
        self._code, self._required = code, required
        self._details: tuple[float, dict[str, tuple[str, ...]], str] | None = None

    def _decoded(self) -> tuple[float, dict[str, tuple[str, ...]], str]:
        if self._details is None:
            self._details = _decode(self.type, self._code, self._required)
        return self._details

    @property
    def price(self) -> float:
        return self._decoded()[0]

    @property
    def options(self) -> dict[str, tuple[str, ...]]:
        """The values offered, per option (one or two at random, plus any required one)."""
        return self._decoded()[1]

    @property
    def brand(self) -> str:
        return self._decoded()[2]

    def reprice(self, price: float) -> None:
        self._details = (price, *self._decoded()[1:])

    @property
    def title(self) -> str:
        """Brand, the first two attributes and the type; all features are on the item page."""
        return f"{self.brand} {' '.join(self.attributes[:2])} {self.type.name}"

    def preselected(self) -> dict[str, str]:
        """Options offered in a single value come chosen, as on a real product page."""
        return {dim: values[0] for dim, values in self.options.items() if len(values) == 1}


def _decode(
    ptype: ProductType, code: int, required: dict[str, str]
) -> tuple[float, dict[str, tuple[str, ...]], str]:
    """Price, offered values (two draws per option, plus ``required``) and brand from ``code``."""
    low, high = ptype.price
    code, k = divmod(code, high - low + 1)
    price = low + k + 0.99
    offered = {}
    for dim, values in ptype.options.items():
        code, first = divmod(code, len(values))
        code, second = divmod(code, len(values))
        keep = {first, second}
        if dim in required:
            keep.add(values.index(required[dim]))
        offered[dim] = tuple(map(values.__getitem__, sorted(keep)))
    return price, offered, ptype.brands[code % len(ptype.brands)]


@dataclass(frozen=True)
class Goal:
    type: ProductType
    attributes: tuple[str, ...]
    options: dict[str, str]
    max_price: float
    text: str

    def score(self, item: Item, chosen: dict[str, str]) -> float:
        """WebShop-style credit in [0, 1]: the share of requirements met (attributes, options,
        price); a wrong product type scores 0. Exactly 1.0 is an exact match."""
        if item.type is not self.type:
            return 0.0
        matched = sum(a in item.attributes for a in self.attributes)
        matched += sum(chosen.get(name) == value for name, value in self.options.items())
        matched += item.price <= self.max_price
        return matched / (len(self.attributes) + len(self.options) + 1)

    def attainable(self, item: Item) -> bool:
        """Whether buying ``item`` with the right options would be an exact match (score 1)."""
        return (
            item.type is self.type
            and all(a in item.attributes for a in self.attributes)
            and item.price <= self.max_price
            and all(value in item.options[dim] for dim, value in self.options.items())
        )

    def plausible(self, item: Item) -> bool:
        """Whether the results page alone (type and price) leaves ``item`` worth opening."""
        return item.type is self.type and item.price <= self.max_price


@dataclass
class Store:
    """One generated store: the catalogue, the goal and the offered queries."""

    items: list[Item]
    goal: Goal
    queries: list[tuple[str, ...]]  # each a tuple of phrases; the query text joins them
    best_query: int  # the one made of every phrase of the instruction
    _rankings: dict[int, list[int]] = field(default_factory=dict)

    def ranked(self, query: int) -> list[int]:
        """Items matching ``query``, best first: the number of query phrases among an item's
        attributes and type (the type counting twice), then popularity. Cached."""
        if query not in self._rankings:
            phrases = self.queries[query]
            scored = []
            for i, item in enumerate(self.items):
                relevance = sum(p in item.attributes for p in phrases)
                relevance += 2 * (item.type.name == phrases[-1])
                if relevance:
                    scored.append((-relevance, -item.popularity, i))
            self._rankings[query] = [i for _, _, i in sorted(scored)]
        return self._rankings[query]

    def query_text(self, query: int) -> str:
        return " ".join(self.queries[query])


# --- generation ------------------------------------------------------------------------------


def generate_store(rng: random.Random, options: ShopOptions) -> Store:
    """Draw a goal, its one exact match, near misses, filler items and the offered queries.

    Every item but the target misses the goal in at least one respect, so ``won`` means
    "bought the target with the right options".
    """
    level = pick(rng, ("few", "many")) if options.distractors == "mixed" else options.distractors
    kind = pick(rng, PRODUCT_TYPES)
    target_attributes = sample(rng, kind.attributes, between(rng, 2, 3))
    wanted = tuple(sample(rng, target_attributes, between(rng, 1, len(target_attributes))))
    dims = sample(rng, sorted(kind.options), between(rng, 1, len(kind.options)))
    wanted_options = {d: pick(rng, kind.options[d]) for d in dims}
    first_id = int(rng.random() * _ASIN_SPACE)

    def new(ptype: ProductType, attributes: list[str], required: dict[str, str]) -> Item:
        # Amazon-style ids (B07A3F9C21), distinct by construction (an odd stride).
        asin = f"B0{(first_id + len(items) * _ASIN_STRIDE) % _ASIN_SPACE:08X}"
        return Item(asin, ptype, tuple(attributes), rng.random(), rng.getrandbits(64), required)

    items: list[Item] = []
    items.append(new(kind, target_attributes, wanted_options))
    max_price = float(math.ceil((items[0].price + 1) / 10) * 10)
    text = _instruction(kind, wanted, wanted_options, max_price)
    goal = Goal(kind, wanted, wanted_options, max_price, text)
    for _ in range(_NEAR_MISSES[level]):
        flaw = pick(rng, ("attribute", "option", "price"))
        attributes = target_attributes
        if flaw == "attribute":
            missing = pick(rng, wanted)
            spare = pick(rng, [a for a in kind.attributes if a not in target_attributes])
            attributes = [spare if a == missing else a for a in attributes]
        item = new(kind, attributes, wanted_options)
        if flaw == "price":
            item.reprice(max_price + between(rng, 1, 20) - 0.01)
        else:
            item.reprice(min(item.price, max_price - 0.01))
        if flaw == "option":  # the wanted value of one option is not offered
            dim = pick(rng, dims)
            others = tuple(v for v in kind.options[dim] if v != wanted_options[dim])
            keep = pick(rng, others), pick(rng, others)
            item.options[dim] = tuple(v for v in others if v in keep)
        items.append(item)
    while len(items) < options.catalogue_size:
        ptype = kind if rng.random() < _SAME_TYPE_SHARE else pick(rng, PRODUCT_TYPES)
        filler = new(ptype, sample(rng, ptype.attributes, between(rng, 1, 3)), {})
        if ptype is not kind or not goal.attainable(filler):
            items.append(filler)
    shuffle(rng, items)

    other = pick(rng, [p for p in PRODUCT_TYPES if p is not kind])
    unwanted = [a for a in kind.attributes if a not in wanted]
    best = (*wanted, kind.name)
    queries = [
        best,
        (kind.name,),
        (pick(rng, wanted if len(wanted) > 1 else unwanted), kind.name),
        (pick(rng, other.attributes), other.name),
    ]
    queries = list(dict.fromkeys(queries))
    shuffle(rng, queries)
    return Store(items, goal, queries, queries.index(best))


def _instruction(
    kind: ProductType, attributes: tuple[str, ...], options: dict[str, str], max_price: float
) -> str:
    """WebShop's wording, e.g. "i am looking for cotton t-shirt with size: large, and price
    lower than 30.00 dollars"."""
    choices = ", and ".join(f"{dim}: {value}" for dim, value in options.items())
    return (
        f"i am looking for {', '.join(attributes)} {kind.name} with {choices}, "
        f"and price lower than {max_price:.2f} dollars"
    )


# --- the environment -------------------------------------------------------------------------


class ShopEnv(DrawnEnv[Store]):
    """WebShop-like shopping tasks; see the module docstring and docs/envs.md.

    Actions: ``search[<query>]`` (one of the offered queries), ``click[<asin>]``,
    ``next page``, ``back`` (like a browser's), ``choose[<option value>]`` and ``buy``. ``buy``
    ends the episode with reward = score (or success, per the ``reward`` option) and
    ``info["score"]``; every other reward is 0. Choices made on an item page are remembered when
    the agent comes back to it.
    """

    name = "shop"
    options_class = ShopOptions
    reward_only_options = frozenset({"reward"})
    expert_step_bound = EXPERT_STEP_BOUND
    options: ShopOptions

    # --- generation and state ---

    def _draw(self, rng: random.Random) -> Store:
        return generate_store(rng, self.options)

    def _start(self, store: Store) -> tuple[str, str]:
        self._store, self._goal = store, store.goal
        self._page: Page = "search"
        self._query = self._page_no = self._item = 0
        self._picked: dict[int, dict[str, str]] = {}  # the agent's choices, per item
        self._opened: set[int] = set()  # items whose page the agent has seen (its knowledge)
        self._score: float | None = None
        return store.goal.text, self._view()

    def _chosen(self) -> dict[str, str]:
        """The options in force on the current item's page."""
        item = self._store.items[self._item]
        return {**item.preselected(), **self._picked.get(self._item, {})}

    def _on_page(self) -> list[int]:
        start = self._page_no * PAGE_SIZE
        return self._store.ranked(self._query)[start : start + PAGE_SIZE]

    def _state_key(self) -> str:
        """Page, query, results page, item and every choice made; not what was only seen."""
        picked = ";".join(
            f"{i}:{','.join(f'{d}={v}' for d, v in sorted(p.items()))}"
            for i, p in sorted(self._picked.items())
        )
        if self._page == "search":
            return f"search|{picked}"
        item = f".{self._item}" if self._page == "item" else ""
        return f"{self._page}.{self._query}.{self._page_no}{item}|{picked}"

    def _info(self) -> Info:
        info = super()._info()
        if self._score is not None:
            info["score"] = self._score
        return info

    # --- pages ---

    def _view(self) -> str:
        if self._page == "search":
            return f"Instruction: {self._goal.text}\n[search]"
        items = self._store.items
        if self._page == "results":
            found = len(self._store.ranked(self._query))
            lines = [f"Page {self._page_no + 1} of {-(-found // PAGE_SIZE)} ({found} results)"]
            for i in self._on_page():
                lines.append(f"[{items[i].asin}] {items[i].title} ${items[i].price:.2f}")
            return "\n".join(lines)
        item = items[self._item]
        lines = [f"[{item.asin}] {item.title}", f"Price: ${item.price:.2f}"]
        lines.append(f"Features: {', '.join(item.attributes)}")
        lines += [f"{dim}: {', '.join(values)}" for dim, values in item.options.items()]
        chosen = self._chosen()
        if chosen:
            lines.append(f"Chosen: {', '.join(chosen.values())}")
        return "\n".join(lines)

    def _invalid_observation(self) -> str:
        """The page again, so an agent that typed something invalid still sees where it is."""
        return f"Nothing happens.\n{self._view()}"

    # --- actions ---

    def _admissible(self) -> dict[str, Effect]:
        actions: dict[str, Effect] = {}
        if self._page == "search":
            for q in range(len(self._store.queries)):
                actions[f"search[{self._store.query_text(q)}]"] = partial(self._search, q)
            return actions
        if self._page == "results":
            for i in self._on_page():
                actions[f"click[{self._store.items[i].asin}]"] = partial(self._click, i)
            if (self._page_no + 1) * PAGE_SIZE < len(self._store.ranked(self._query)):
                actions["next page"] = self._next_page
            actions["back"] = self._back
            return actions
        item, chosen = self._store.items[self._item], self._chosen()
        for dim, values in item.options.items():
            for value in values if len(values) > 1 else ():
                if chosen.get(dim) != value:
                    actions[f"choose[{value}]"] = partial(self._choose, dim, value)
        if self.options.buy == "anytime" or len(chosen) == len(item.options):
            actions["buy"] = self._buy
        actions["back"] = self._back
        return actions

    def _search(self, query: int) -> str:
        self._page, self._query, self._page_no = "results", query, 0
        return self._view()

    def _click(self, item: int) -> str:
        self._page, self._item = "item", item
        self._opened.add(item)
        return self._view()

    def _next_page(self) -> str:
        self._page_no += 1
        return self._view()

    def _back(self) -> str:
        """Like a browser's back: item -> its results page -> the previous page -> search."""
        if self._page == "item":
            self._page = "results"
        elif self._page_no:
            self._page_no -= 1
        else:
            self._page = "search"
        return self._view()

    def _choose(self, dim: str, value: str) -> str:
        self._picked.setdefault(self._item, {})[dim] = value
        return self._view()

    def _buy(self) -> str:
        item, chosen = self._store.items[self._item], self._chosen()
        self._score = score = self._goal.score(item, chosen)
        won = score == 1.0
        self._finish(score if self.options.reward == "score" else float(won), won)
        return (
            f"Thank you for shopping with us! You bought [{item.asin}] {item.title} "
            f"({', '.join(chosen.values()) or 'no options'}). Your score: {score:.2f}"
        )

    # --- the expert ---

    def _expert(self) -> str:
        """Shop like a careful person: search with every phrase of the instruction, open the
        results that could fit (right type, within budget, not yet ruled out) in rank order,
        go back from the ones that do not, and on the right one choose the options and buy.

        It sees what the agent sees (and remembers what it opened), and recovers from any page,
        so noisy experts recover; only ``buy`` is final.
        """
        store, goal = self._store, self._goal
        if self._page == "search":
            return f"search[{store.query_text(store.best_query)}]"
        if self._page == "results":
            if self._query != store.best_query:
                return "back"
            ranked = store.ranked(self._query)
            worth = next(p for p, i in enumerate(ranked) if self._worth_opening(i))
            if worth // PAGE_SIZE == self._page_no:
                return f"click[{store.items[ranked[worth]].asin}]"
            return "next page" if worth // PAGE_SIZE > self._page_no else "back"
        item, chosen = store.items[self._item], self._chosen()
        if not goal.attainable(item):
            return "back"
        for dim, value in goal.options.items():
            if chosen.get(dim) != value:
                return f"choose[{value}]"
        if self.options.buy == "after_options":
            for dim, values in item.options.items():
                if dim not in chosen:
                    return f"choose[{values[0]}]"
        return "buy"

    def _worth_opening(self, i: int) -> bool:
        item = self._store.items[i]
        return self._goal.plausible(item) and (i not in self._opened or self._goal.attainable(item))
