"""Locust users browsing `loadgen serve` like shoppers, each with its own client IP (sent as
X-Forwarded-For; expected 404s count as successes). Run:
locust -f loadgen/locustfile.py --headless -u 20 -r 5 -t 30s --host http://127.0.0.1:8080"""

from __future__ import annotations

import os
import random

import numpy as np
from locust import HttpUser, between, task

from loadgen.generator import IpPool

__all__ = ["Shopper", "client_pool"]

_STATIC = ("/static/css/site.css", "/static/js/app.js", "/static/img/logo.png")
_QUERIES = ("blue", "trail shoes", "jacket", "warm gloves", "tent", "red cap", "bottle")
_PRODUCT_IDS = 200


def client_pool() -> list[str]:
    """The client IPs users draw from (same env, same pool): env LOADGEN_LOCUST_IPS (pool size,
    default 500), LOADGEN_LOCUST_IPV6_SHARE (default 0.1), LOADGEN_LOCUST_SEED (default 7)."""
    size = int(os.environ.get("LOADGEN_LOCUST_IPS", "500"))
    share = float(os.environ.get("LOADGEN_LOCUST_IPV6_SHARE", "0.1"))
    seed = int(os.environ.get("LOADGEN_LOCUST_SEED", "7"))
    return IpPool(size, 0.0, share, np.random.default_rng(seed)).ips


_POOL = client_pool()


class Shopper(HttpUser):
    """A visitor: lands on the home page, browses products, searches, sometimes buys."""

    wait_time = between(0.2, 1.0)

    def on_start(self) -> None:
        self.ip = random.choice(_POOL)
        self.client.headers["X-Forwarded-For"] = self.ip
        self.client.headers["User-Agent"] = f"locust-shopper/1.0 ({self.ip})"
        self.last_page = "-"

    def _get(self, path: str, name: str | None = None, *, page: bool = True) -> None:
        headers = {"Referer": f"{self.host}{self.last_page}"} if self.last_page != "-" else {}
        self.client.get(path, name=name or path, headers=headers)
        if page:
            self.last_page = path

    @task(10)
    def home(self) -> None:
        self._get("/")

    @task(6)
    def product_list(self) -> None:
        self._get(f"/products?page={random.randint(1, 8)}", name="/products?page=[n]")

    @task(12)
    def product_page(self) -> None:
        self._get(f"/products/{random.randint(1, _PRODUCT_IDS)}", name="/products/[id]")

    @task(5)
    def search(self) -> None:
        self._get(f"/search?q={random.choice(_QUERIES).replace(' ', '+')}", name="/search?q=[q]")

    @task(3)
    def add_to_cart(self) -> None:
        pid = random.randint(1, _PRODUCT_IDS)
        self.client.post("/cart", data={"product_id": pid, "qty": random.randint(1, 3)})

    @task(8)
    def static_assets(self) -> None:
        for path in _STATIC:
            self._get(path, page=False)

    @task(1)
    def missing_page(self) -> None:
        # An expected 404 (a stale link): a success for the load test, still one access record.
        with self.client.get(
            f"/old-page-{random.randint(1, 50)}.html",
            name="/old-page-[n].html",
            catch_response=True,
        ) as resp:
            if resp.status_code == 404:
                resp.success()
            else:
                resp.failure(f"expected 404, got {resp.status_code}")
