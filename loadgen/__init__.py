"""loadgen: the access-record website (`loadgen serve`), the synthetic emitter (`loadgen synth`)
and the pipeline benchmarks (`loadgen bench`, in `loadgen.bench`)."""

from __future__ import annotations

__all__: list[str] = []
