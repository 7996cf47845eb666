"""The shop database of the SQL family: its schema, seeded contents, content digest, and read helpers.

A task carries its shop's rows in full in `Task.setup`, so the task's hash covers the exact data
the agent sees, and a change to the generator can never silently change an existing task.
"""

from __future__ import annotations

import copy
import datetime
import random
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from reprorl.hashing import canonical_json, content_hash

DB_NAME = "shop.db"
STATUSES = ("pending", "shipped", "delivered", "cancelled")

Rows = dict[str, list[list[Any]]]
"""Table name -> rows, each a list of values in the table's column order."""


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    ddl: str


TABLES: tuple[Table, ...] = (
    Table(
        "customers",
        ("id", "name", "email", "city"),
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, email TEXT NOT NULL,"
        " city TEXT NOT NULL)",
    ),
    Table(
        "products",
        ("id", "name", "category", "price_cents", "stock"),
        "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, category TEXT NOT NULL,"
        " price_cents INTEGER NOT NULL CHECK (price_cents >= 0), stock INTEGER NOT NULL CHECK (stock >= 0))",
    ),
    Table(
        "orders",
        ("id", "customer_id", "status", "created"),
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),"
        " status TEXT NOT NULL CHECK (status IN ('pending', 'shipped', 'delivered', 'cancelled')),"
        " created TEXT NOT NULL)",
    ),
    Table(
        "order_items",
        ("order_id", "product_id", "qty"),
        "CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id),"
        " product_id INTEGER NOT NULL REFERENCES products(id), qty INTEGER NOT NULL CHECK (qty > 0),"
        " PRIMARY KEY (order_id, product_id))",
    ),
)
TABLE_BY_NAME = {t.name: t for t in TABLES}

_PRODUCTS = (
    ("Walnut Desk Lamp", "lighting"),
    ("Brass Floor Lamp", "lighting"),
    ("Paper Pendant Shade", "lighting"),
    ("LED Strip Kit", "lighting"),
    ("Oak Side Table", "furniture"),
    ("Linen Armchair", "furniture"),
    ("Pine Bookshelf", "furniture"),
    ("Folding Stool", "furniture"),
    ("Cast Iron Skillet", "kitchen"),
    ("Ceramic Teapot", "kitchen"),
    ("Chef Knife", "kitchen"),
    ("Bamboo Cutting Board", "kitchen"),
    ("Stand Mixer", "kitchen"),
    ("Mechanical Keyboard", "office"),
    ("Ergonomic Mouse", "office"),
    ("Monitor Arm", "office"),
    ("Fountain Pen", "office"),
    ("Desk Organizer", "office"),
    ("Garden Hose", "garden"),
    ("Pruning Shears", "garden"),
    ("Terracotta Planter", "garden"),
    ("Bird Feeder", "garden"),
    ("Bluetooth Speaker", "audio"),
    ("Studio Headphones", "audio"),
    ("Vinyl Turntable", "audio"),
    ("Podcast Microphone", "audio"),
    ("Wool Throw Blanket", "textiles"),
    ("Cotton Bath Towel", "textiles"),
    ("Silk Pillowcase", "textiles"),
    ("Jute Doormat", "textiles"),
)
_FIRST = (
    "Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ingrid", "Jonas", "Kemal",
    "Leila", "Marco", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tamara", "Umar", "Vera",
)  # fmt: skip
_LAST = (
    "Moreno", "Okafor", "Lindqvist", "Tanaka", "Novak", "Haddad", "Schulz", "Ferreira", "Kowalski", "Byrne",
    "Castillo", "Dubois", "Eriksen", "Gallo", "Ivanova", "Jensen", "Keller", "Laine", "Mendes", "Nakamura",
)  # fmt: skip
_CITIES = ("Lyon", "Porto", "Gdansk", "Leeds", "Bergen", "Turin", "Ghent")
_STATUS_WEIGHTS = (4, 3, 3, 1)
_EPOCH = datetime.date(2024, 1, 1)


def generate_shop(rng: random.Random) -> Rows:
    """A few dozen rows of a plausible shop, drawn from `rng` alone."""
    catalog = rng.sample(_PRODUCTS, rng.randint(12, 16))
    products: list[list[Any]] = [
        [i + 1, name, category, rng.randint(3, 150) * 100 - rng.choice((1, 5, 51)), rng.randint(0, 60)]
        for i, (name, category) in enumerate(catalog)
    ]
    count = rng.randint(8, 11)
    names = list(zip(rng.sample(_FIRST, count), rng.sample(_LAST, count), strict=True))
    customers = [
        [i + 1, f"{first} {last}", f"{first.lower()}.{last.lower()}@example.com", rng.choice(_CITIES)]
        for i, (first, last) in enumerate(names)
    ]
    weights = [rng.randint(1, 6) for _ in customers]
    days = sorted(rng.sample(range(300), rng.randint(20, 30)))
    orders: list[list[Any]] = []
    items: list[list[Any]] = []
    for i, day in enumerate(days):
        order_id = i + 1
        customer = rng.choices(customers, weights)[0]
        status = rng.choices(STATUSES, _STATUS_WEIGHTS)[0]
        orders.append([order_id, customer[0], status, (_EPOCH + datetime.timedelta(days=day)).isoformat()])
        for product in sorted(rng.sample(products, rng.randint(1, 4)), key=lambda p: p[0]):
            items.append([order_id, product[0], rng.randint(1, 5)])
    return {"customers": customers, "products": products, "orders": orders, "order_items": items}


def table_digest(columns: list[str], rows: list[list[Any]]) -> str:
    """Digest of a table's content, independent of row order (the verifier computes the same)."""
    return content_hash({"columns": columns, "rows": sorted(rows, key=canonical_json)})


def digests(rows: Rows) -> dict[str, dict[str, Any]]:
    """The expected content of every table, as the verifier's reference wants it."""
    return {
        t.name: {"columns": list(t.columns), "digest": table_digest(list(t.columns), rows[t.name])}
        for t in TABLES
    }


def as_dicts(rows: Rows, table: str) -> list[dict[str, Any]]:
    """A table's rows keyed by column name (the generator's task kinds read them this way)."""
    columns = TABLE_BY_NAME[table].columns
    return [dict(zip(columns, row, strict=True)) for row in rows[table]]


class Shop:
    """Read helpers over a shop's rows (rows keyed by column)."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.products = as_dicts(rows, "products")
        self.customers = as_dicts(rows, "customers")
        self.orders = as_dicts(rows, "orders")
        self.items = as_dicts(rows, "order_items")
        self.price = {p["id"]: p["price_cents"] for p in self.products}
        self.status = {o["id"]: o["status"] for o in self.orders}

    def customer(self, customer_id: int) -> dict[str, Any]:
        return next(c for c in self.customers if c["id"] == customer_id)

    def order(self, order_id: int) -> dict[str, Any]:
        return next(o for o in self.orders if o["id"] == order_id)

    def product(self, product_id: int) -> dict[str, Any]:
        return next(p for p in self.products if p["id"] == product_id)

    def items_of(self, order_id: int) -> list[dict[str, Any]]:
        return [i for i in self.items if i["order_id"] == order_id]

    def value_of(self, order_id: int) -> int:
        return sum(i["qty"] * self.price[i["product_id"]] for i in self.items_of(order_id))

    def orders_of(self, customer_id: int) -> list[dict[str, Any]]:
        return [o for o in self.orders if o["customer_id"] == customer_id]

    def units(self, status: str) -> Counter[int]:
        """Units of each product in orders with `status`."""
        units: Counter[int] = Counter()
        for item in self.items:
            if self.status[item["order_id"]] == status:
                units[item["product_id"]] += item["qty"]
        return units

    def changed(self, table: str, ids: Collection[int], column: str, value: Callable[[Any], Any]) -> Rows:
        """A copy of the rows in which `column` of the `table` rows with an id in `ids` is `value(old)`."""
        rows = copy.deepcopy(self.rows)
        index = TABLE_BY_NAME[table].columns.index(column)
        for row in rows[table]:
            if row[0] in ids:
                row[index] = value(row[index])
        return rows
