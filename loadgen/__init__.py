"""loadgen: the access-record website (`loadgen serve`) and the synthetic emitter (`loadgen
synth`), with their ground-truth ledger. The benchmarks that drive it are `ipcount bench`."""

from __future__ import annotations

__all__: list[str] = []
