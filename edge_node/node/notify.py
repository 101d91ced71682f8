"""systemd integration without a dependency: ``sd_notify`` datagrams and the watchdog ping.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET``; the daemon sends ``READY=1`` once it serves,
``STATUS=...`` lines, ``STOPPING=1`` on shutdown, and ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while its
main loop is alive (a heartbeat younger than the watchdog interval). Outside systemd all of it is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

_LOGGER = logging.getLogger(__name__)


def sd_notify(message: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``message`` to systemd's notify socket; False when there is none (not under systemd)."""
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # "@": the abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        _LOGGER.warning("cannot notify systemd at %s: %s", path, exc)
        return False
    return True


def watchdog_interval_s(env: Mapping[str, str] = os.environ) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds when systemd watches this process, else None."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


class Watchdog:
    """Pings ``WATCHDOG=1`` while ``heartbeat()`` (a monotonic time) is recent; stops pinging when it is not.

    A main loop that hangs stops the pings, so systemd restarts the service after ``WatchdogSec``.
    """

    def __init__(self, interval_s: float, heartbeat: Callable[[], float], max_age_s: float) -> None:
        self.interval_s = interval_s
        self._heartbeat = heartbeat
        self._max_age_s = max_age_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edge-node-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            age = time.monotonic() - self._heartbeat()
            if age <= self._max_age_s:
                sd_notify("WATCHDOG=1")
            else:
                _LOGGER.error("main loop silent for %.0f s: not pinging the systemd watchdog", age)
