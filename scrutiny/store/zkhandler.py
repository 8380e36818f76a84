"""kazoo's threading handler with its `select` on poll(2).

kazoo's own `selector_select` makes an epoll instance, registers the sockets, waits and closes it, at each of
the three selects a packet costs its connection thread; a continuous leader's thread wakes for every change
notification (`bench.zkwatch`). poll(2) is one call. Ready sockets come back in the order given, as from
kazoo's own: an epoll made for one select lists what is ready at once in the order it was registered.
"""

from __future__ import annotations

import selectors
import types
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select

_POLL = types.SimpleNamespace(DefaultSelector=selectors.PollSelector, EVENT_READ=selectors.EVENT_READ,
                              EVENT_WRITE=selectors.EVENT_WRITE)


class PollingHandler(SequentialThreadingHandler):
    name = "scrutiny_polling_threading_handler"

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return selector_select(*args, selectors_module=_POLL, **kwargs)
