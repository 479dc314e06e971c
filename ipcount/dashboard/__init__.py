"""People-facing live views of the sink's results: the top-N IPs per window (one computation,
shared by `ipcount top` and `ipcount dashboard`), its terminal form, and the web dashboard."""

__all__: list[str] = []
