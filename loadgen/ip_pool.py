"""The client IP pool of the generator (pure, loadgen process): unicast IPv4 and canonical IPv6
addresses with Zipf-like skew, sampled per batch."""

from __future__ import annotations

import ipaddress

import numpy as np

__all__ = ["IpPool", "zipf_weights"]


def zipf_weights(n: int, skew: float) -> np.ndarray:
    """Normalised Zipf-like weights 1/rank**skew for ranks 1..n (skew 0 is uniform)."""
    if n <= 0:
        return np.zeros(0)
    w = 1.0 / np.power(np.arange(1, n + 1, dtype=np.float64), skew)
    return np.asarray(w / w.sum())


def _ipv4_addresses(n: int, rng: np.random.Generator) -> list[str]:
    seen: set[int] = set()
    out: list[int] = []
    while len(out) < n:
        # 1.0.0.0 .. 223.255.255.255 without 127/8 (loopback); unicast only.
        for a in rng.integers(1 << 24, 224 << 24, size=2 * (n - len(out)) + 8).tolist():
            if a >> 24 == 127 or a in seen:
                continue
            seen.add(a)
            out.append(a)
            if len(out) == n:
                break
    return [f"{a >> 24}.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}" for a in out]


def _ipv6_addresses(n: int, rng: np.random.Generator) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        m = 2 * (n - len(out)) + 8
        groups = rng.integers(0, 1 << 16, size=(m, 8), dtype=np.int64)
        groups[:, 0] = 0x2001
        groups[:, 1] = 0x0DB8
        # Zero some groups so both full and '::'-compressed forms occur.
        groups[:, 2:][rng.random((m, 6)) < 0.3] = 0
        for row in groups.tolist():
            value = 0
            for g in row:
                value = (value << 16) | g
            text = ipaddress.IPv6Address(value).compressed  # canonical, lower-case
            if text not in seen:
                seen.add(text)
                out.append(text)
                if len(out) == n:
                    break
    return out


class IpPool:
    """Client IPs with Zipf-like skew; `ipv6_share` of the records (not only addresses) are IPv6.

    The pool is a mixture: IPv4 and IPv6 addresses each get Zipf weights within their family, and
    the families are weighted (1 - share, share), so skew and IPv6 share are independent knobs.
    """

    def __init__(self, size: int, skew: float, ipv6_share: float, rng: np.random.Generator) -> None:
        n6 = round(size * ipv6_share)
        if 0 < ipv6_share and n6 == 0:
            n6 = 1
        if ipv6_share < 1 and n6 == size and size > 1:
            n6 = size - 1
        n4 = size - n6
        share = ipv6_share if n4 and n6 else (1.0 if n6 else 0.0)
        self.ips: list[str] = _ipv4_addresses(n4, rng) + _ipv6_addresses(n6, rng)
        self.keys: list[bytes] = [ip.encode("ascii") for ip in self.ips]
        self.is_ipv6 = np.zeros(size, dtype=bool)
        self.is_ipv6[n4:] = True
        self.probabilities = np.concatenate(
            [zipf_weights(n4, skew) * (1.0 - share), zipf_weights(n6, skew) * share]
        )
        # The sampling table: inverse-CDF lookup with searchsorted, vectorised per batch.
        self._cdf = np.cumsum(self.probabilities)
        self._cdf[-1] = 1.0

    def __len__(self) -> int:
        return len(self.ips)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n pool indexes drawn by the skewed distribution."""
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        return np.minimum(idx, len(self.ips) - 1).astype(np.int64)
