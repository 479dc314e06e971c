"""loadgen: the access-record website (`loadgen serve`) and synthetic emitter (`loadgen synth`)."""

from __future__ import annotations

__all__: list[str] = []
