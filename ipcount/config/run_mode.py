"""How one run of the job starts and ends (`ipcount run`'s --available-now, --close-all-windows,
--new-query): one value handed from the command to the job, its source and its sink check."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ipcount.errors import ConfigError

__all__ = ["RunMode"]


@dataclass(frozen=True)
class RunMode:
    """`available_now`: process what the source holds now, then stop (a bounded run).
    `close_all_windows`: with available_now, the input is finished: emit every window, also those
    the data has not closed yet. `new_query`: this checkpoint is new and the sink holds another
    query's output: start where that output ends (see sink.history).

    Raises:
        ConfigError: close_all_windows without available_now.
    """

    available_now: bool = False
    close_all_windows: bool = False
    new_query: bool = False

    def __post_init__(self) -> None:
        if self.close_all_windows and not self.available_now:
            raise ConfigError("--close-all-windows needs --available-now (a bounded run)")

    def restarted(self) -> RunMode:
        """The mode of an in-process restart: the first start made the checkpoint this query's,
        so a restart is no longer a new query."""
        return dataclasses.replace(self, new_query=False)
