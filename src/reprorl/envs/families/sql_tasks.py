"""The SQL family's task kinds: questions about a shop and changes to make in it, with expected outcomes.

Expected answers and expected final tables are computed here in Python from the rows, independently
of the SQL the oracle runs, so the oracle solving every task checks the generator and the tools
against each other.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reprorl.envs.families.sql_data import TABLE_BY_NAME, Rows, Shop


@dataclass(frozen=True)
class Draft:
    """A task before it becomes a `Task`: its text, its oracle's calls, and what must hold at the end."""

    kind: str
    text: str
    difficulty: int
    calls: tuple[tuple[str, str], ...]
    """(tool, sql) in the oracle's order."""
    answer: int | str | None = None
    distractors: tuple[str, ...] = ()
    final: Rows | None = None
    present: dict[str, list[list[Any]]] = field(default_factory=dict)
    absent: dict[str, list[list[Any]]] = field(default_factory=dict)


def q(text: str) -> str:
    """An SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _query(sql: str) -> tuple[str, str]:
    return ("sql_query", sql)


def _execute(sql: str) -> tuple[str, str]:
    return ("sql_execute", sql)


def _unique_max(counts: dict[Any, int]) -> Any | None:
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


# -- questions -------------------------------------------------------------------------------------


def stock_of(rng: random.Random, shop: Shop) -> Draft | None:
    p = rng.choice(shop.products)
    if p["stock"] == 0:
        return None  # zero is what a policy that guesses says first
    sql = f"SELECT stock FROM products WHERE name = {q(p['name'])}"
    text = f"How many units of {p['name']} are in stock? Answer with the number."
    return Draft("stock_of", text, 1, (_query(sql),), answer=p["stock"])


def order_total(rng: random.Random, shop: Shop) -> Draft | None:
    o = rng.choice([o for o in shop.orders if len(shop.items_of(o["id"])) >= 2] or shop.orders)
    sql = (
        "SELECT sum(oi.qty * p.price_cents) FROM order_items oi JOIN products p ON p.id = oi.product_id"
        f" WHERE oi.order_id = {o['id']}"
    )
    text = (
        f"What is the total value in cents of order {o['id']}, i.e. the sum over its items of quantity times"
        " the product's current price? Answer with the number."
    )
    return Draft("order_total", text, 2, (_query(sql),), answer=shop.value_of(o["id"]))


def active_orders(rng: random.Random, shop: Shop) -> Draft | None:
    c = rng.choice(shop.customers)
    count = sum(1 for o in shop.orders_of(c["id"]) if o["status"] != "cancelled")
    if count == 0:
        return None
    sql = (
        "SELECT count(*) FROM orders o JOIN customers c ON c.id = o.customer_id"
        f" WHERE c.name = {q(c['name'])} AND o.status <> 'cancelled'"
    )
    text = f"How many orders has {c['name']} placed that were not cancelled? Answer with the number."
    return Draft("active_orders", text, 2, (_query(sql),), answer=count)


def pending_units(rng: random.Random, shop: Shop) -> Draft | None:
    units = shop.units("pending")
    if not units:
        return None
    p = shop.product(rng.choice(sorted(units)))
    sql = (
        "SELECT sum(oi.qty) FROM order_items oi JOIN orders o ON o.id = oi.order_id"
        f" JOIN products p ON p.id = oi.product_id WHERE o.status = 'pending' AND p.name = {q(p['name'])}"
    )
    text = f"How many units of {p['name']} are waiting in pending orders, in total? Answer with the number."
    return Draft("pending_units", text, 2, (_query(sql),), answer=units[p["id"]])


def top_customer(rng: random.Random, shop: Shop) -> Draft | None:
    city = rng.choice(sorted({c["city"] for c in shop.customers}))
    status = rng.choice(("pending", "shipped", "delivered", None))
    local = {c["id"] for c in shop.customers if c["city"] == city}
    counts = Counter(
        o["customer_id"] for o in shop.orders if o["customer_id"] in local and status in (None, o["status"])
    )
    best = _unique_max(dict(counts))
    if best is None:
        return None
    where = f"c.city = {q(city)}" + (f" AND o.status = {q(status)}" if status else "")
    sql = (
        "SELECT c.name, count(*) AS n FROM orders o JOIN customers c ON c.id = o.customer_id"
        f" WHERE {where} GROUP BY c.id ORDER BY n DESC LIMIT 1"
    )
    others = tuple(c["name"] for c in shop.customers if c["id"] != best)
    what = f"{status} orders" if status else "orders (of any status)"
    text = f"Which customer from {city} has placed the most {what}? Answer with the customer's full name."
    return Draft(
        "top_customer", text, 3, (_query(sql),), answer=shop.customer(best)["name"], distractors=others
    )


def top_spender(rng: random.Random, shop: Shop) -> Draft | None:
    category = rng.choice(sorted({p["category"] for p in shop.products}))
    spend: Counter[int] = Counter()
    for item in shop.items:
        order = shop.order(item["order_id"])
        product = shop.product(item["product_id"])
        if order["status"] != "cancelled" and product["category"] == category:
            spend[order["customer_id"]] += item["qty"] * product["price_cents"]
    best = _unique_max(dict(spend))
    if best is None:
        return None
    sql = (
        "SELECT c.name, sum(oi.qty * p.price_cents) AS total FROM orders o"
        " JOIN customers c ON c.id = o.customer_id JOIN order_items oi ON oi.order_id = o.id"
        " JOIN products p ON p.id = oi.product_id"
        f" WHERE o.status <> 'cancelled' AND p.category = {q(category)}"
        " GROUP BY c.id ORDER BY total DESC LIMIT 1"
    )
    others = tuple(c["name"] for c in shop.customers if c["id"] != best)
    text = (
        f"Which customer has spent the most on {category} products, counting every order that was not"
        " cancelled at the products' current prices? Answer with the customer's full name."
    )
    return Draft(
        "top_spender", text, 3, (_query(sql),), answer=shop.customer(best)["name"], distractors=others
    )


def customer_spend(rng: random.Random, shop: Shop) -> Draft | None:
    buyers = sorted({o["customer_id"] for o in shop.orders if o["status"] == "delivered"})
    if not buyers:
        return None
    c = shop.customer(rng.choice(buyers))
    total = sum(shop.value_of(o["id"]) for o in shop.orders_of(c["id"]) if o["status"] == "delivered")
    sql = (
        "SELECT sum(oi.qty * p.price_cents) FROM orders o JOIN customers c ON c.id = o.customer_id"
        " JOIN order_items oi ON oi.order_id = o.id JOIN products p ON p.id = oi.product_id"
        f" WHERE c.name = {q(c['name'])} AND o.status = 'delivered'"
    )
    text = (
        f"What is the total value in cents of all delivered orders of {c['name']}, at the products' current"
        " prices? Answer with the number."
    )
    return Draft("customer_spend", text, 3, (_query(sql),), answer=total)


def top_product(rng: random.Random, shop: Shop) -> Draft | None:
    category = rng.choice(sorted({p["category"] for p in shop.products}))
    status = rng.choice(("pending", "shipped", "delivered"))
    units = shop.units(status)
    best = _unique_max({p: n for p, n in units.items() if shop.product(p)["category"] == category})
    if best is None:
        return None
    sql = (
        "SELECT p.name, sum(oi.qty) AS units FROM order_items oi JOIN orders o ON o.id = oi.order_id"
        " JOIN products p ON p.id = oi.product_id"
        f" WHERE o.status = {q(status)} AND p.category = {q(category)}"
        " GROUP BY p.id ORDER BY units DESC LIMIT 1"
    )
    others = tuple(p["name"] for p in shop.products if p["id"] != best)
    text = f"Which {category} product has the most units in {status} orders? Answer with the product's name."
    return Draft(
        "top_product", text, 3, (_query(sql),), answer=shop.product(best)["name"], distractors=others
    )


# -- changes ---------------------------------------------------------------------------------------


def set_price(rng: random.Random, shop: Shop) -> Draft | None:
    p = rng.choice(shop.products)
    price = rng.randint(3, 150) * 100 - 1
    if price == p["price_cents"]:
        return None
    final = shop.changed("products", {p["id"]}, "price_cents", lambda _: price)
    sql = f"UPDATE products SET price_cents = {price} WHERE name = {q(p['name'])}"
    text = f"Set the price of {p['name']} to {price} cents."
    present = {"products": [r for r in final["products"] if r[0] == p["id"]]}
    return Draft("set_price", text, 1, (_execute(sql),), final=final, present=present)


def restock_low(rng: random.Random, shop: Shop) -> Draft | None:
    threshold = rng.choice((5, 10, 15, 20))
    low = [p["id"] for p in shop.products if p["stock"] < threshold]
    if not low or len(low) == len(shop.products):
        return None
    extra = rng.choice((10, 20, 25, 50))
    final = shop.changed("products", low, "stock", lambda stock: stock + extra)
    sql = f"UPDATE products SET stock = stock + {extra} WHERE stock < {threshold}"
    text = f"Add {extra} units to the stock of every product that has fewer than {threshold} units in stock."
    present = {"products": [r for r in final["products"] if r[0] in low]}
    return Draft("restock_low", text, 2, (_execute(sql),), final=final, present=present)


def cancel_pending(rng: random.Random, shop: Shop) -> Draft | None:
    owners = sorted({o["customer_id"] for o in shop.orders if o["status"] == "pending"})
    if not owners:
        return None
    c = shop.customer(rng.choice(owners))
    targets = {o["id"] for o in shop.orders_of(c["id"]) if o["status"] == "pending"}
    final = shop.changed("orders", targets, "status", lambda _: "cancelled")
    sql = (
        "UPDATE orders SET status = 'cancelled' WHERE status = 'pending'"
        f" AND customer_id = (SELECT id FROM customers WHERE name = {q(c['name'])})"
    )
    text = f"Cancel all pending orders of {c['name']}. Leave their other orders as they are."
    present = {"orders": [r for r in final["orders"] if r[0] in targets]}
    return Draft("cancel_pending", text, 2, (_execute(sql),), final=final, present=present)


def remove_item(rng: random.Random, shop: Shop) -> Draft | None:
    candidates = [o for o in shop.orders if o["status"] == "pending" and len(shop.items_of(o["id"])) >= 2]
    if not candidates:
        return None
    o = rng.choice(candidates)
    item = rng.choice(shop.items_of(o["id"]))
    p = shop.product(item["product_id"])
    final = copy.deepcopy(shop.rows)
    gone = [o["id"], p["id"], item["qty"]]
    final["order_items"] = [r for r in final["order_items"] if r != gone]
    sql = (
        f"DELETE FROM order_items WHERE order_id = {o['id']}"
        f" AND product_id = (SELECT id FROM products WHERE name = {q(p['name'])})"
    )
    text = f"Remove {p['name']} from order {o['id']}; the order's other items stay."
    return Draft("remove_item", text, 2, (_execute(sql),), final=final, absent={"order_items": [gone]})


def _ship(shop: Shop, order_id: int) -> tuple[Rows, dict[str, list[list[Any]]]] | None:
    items = {i["product_id"]: i["qty"] for i in shop.items_of(order_id)}
    if any(p["stock"] < items[p["id"]] for p in shop.products if p["id"] in items):
        return None
    rows = shop.changed("orders", {order_id}, "status", lambda _: "shipped")
    stock = TABLE_BY_NAME["products"].columns.index("stock")
    for row in rows["products"]:
        row[stock] -= items.get(row[0], 0)
    present = {
        "orders": [r for r in rows["orders"] if r[0] == order_id],
        "products": [r for r in rows["products"] if r[0] in items],
    }
    return rows, present


def _ship_sql(order_id: int) -> tuple[tuple[str, str], ...]:
    return (
        _execute(f"UPDATE orders SET status = 'shipped' WHERE id = {order_id}"),
        _execute(
            "UPDATE products SET stock = stock - (SELECT qty FROM order_items"
            f" WHERE order_id = {order_id} AND product_id = products.id)"
            f" WHERE id IN (SELECT product_id FROM order_items WHERE order_id = {order_id})"
        ),
    )


_SHIP_RULE = (
    "set its status to 'shipped' and reduce the stock of each of its products by the quantity ordered."
)


def ship_order(rng: random.Random, shop: Shop) -> Draft | None:
    pending = [o for o in shop.orders if o["status"] == "pending"]
    if not pending:
        return None
    o = rng.choice(pending)
    shipped = _ship(shop, o["id"])
    if shipped is None:
        return None
    text = f"Ship order {o['id']}: {_SHIP_RULE}"
    return Draft("ship_order", text, 3, _ship_sql(o["id"]), final=shipped[0], present=shipped[1])


def ship_oldest(rng: random.Random, shop: Shop) -> Draft | None:
    owners = sorted({o["customer_id"] for o in shop.orders if o["status"] == "pending"})
    if not owners:
        return None
    c = shop.customer(rng.choice(owners))
    oldest = min((o for o in shop.orders_of(c["id"]) if o["status"] == "pending"), key=lambda o: o["created"])
    shipped = _ship(shop, oldest["id"])
    if shipped is None:
        return None
    lookup = _query(
        "SELECT o.id, o.created FROM orders o JOIN customers c ON c.id = o.customer_id"
        f" WHERE c.name = {q(c['name'])} AND o.status = 'pending' ORDER BY o.created LIMIT 1"
    )
    text = f"Ship the oldest pending order of {c['name']}: {_SHIP_RULE}"
    return Draft(
        "ship_oldest", text, 3, (lookup, *_ship_sql(oldest["id"])), final=shipped[0], present=shipped[1]
    )


def new_order(rng: random.Random, shop: Shop) -> Draft | None:
    c = rng.choice(shop.customers)
    p = rng.choice(shop.products)
    qty = rng.randint(1, 4)
    order_id = max(o["id"] for o in shop.orders) + 1
    order = [order_id, c["id"], "pending", "2024-12-02"]
    final = copy.deepcopy(shop.rows)
    final["orders"].append(order)
    final["order_items"].append([order_id, p["id"], qty])
    calls = (
        _execute(
            f"INSERT INTO orders (id, customer_id, status, created)"
            f" SELECT {order_id}, id, 'pending', '2024-12-02' FROM customers WHERE name = {q(c['name'])}"
        ),
        _execute(
            f"INSERT INTO order_items (order_id, product_id, qty) SELECT {order_id}, id, {qty}"
            f" FROM products WHERE name = {q(p['name'])}"
        ),
    )
    text = (
        f"Record a new pending order with id {order_id} for {c['name']}, created on 2024-12-02, for {qty}"
        f" unit{'s' if qty > 1 else ''} of {p['name']}. Do not change stock."
    )
    present = {"orders": [order], "order_items": [[order_id, p["id"], qty]]}
    return Draft("new_order", text, 3, calls, final=final, present=present)


KINDS: tuple[Callable[[random.Random, Shop], Draft | None], ...] = (
    stock_of,
    order_total,
    active_orders,
    pending_units,
    top_customer,
    top_spender,
    customer_spend,
    top_product,
    set_price,
    restock_low,
    cancel_pending,
    remove_item,
    ship_order,
    ship_oldest,
    new_order,
)
