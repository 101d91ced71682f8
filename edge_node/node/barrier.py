"""Waiting until peers have published a round: the lock-step barrier, and a finished node serving slower peers.

Both ask each peer for its Hello (its published round) in parallel, again every ``POLL_S``, until every
peer has published the round, or has left, or the budget runs out. What counts as "left" is the caller's
choice (``gone_after_s``): in a lock-step fleet a peer passes the last barrier before it leaves, so one
that does not answer is done at once; a free-running node asks the peers discovery lists now, and on a
lossy link one failed Hello proves nothing (a lost SYN and its retry outlast the Hello's 2 s), so only a
peer that has answered none for ``gone_after_s`` counts as gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from edge_node.errors import PeerUnreachable
from edge_node.net import PeerAddress
from edge_node.node.parallel import Abandoned, Stopped, run_parallel
from edge_node.node.peers import HELLO_WORKERS, Caller

POLL_S = 0.2  # between rounds of Hellos
_TRANSIENT = ("unreachable", "timeout")  # a Hello that got no answer; any other failure is the peer's answer


def wait_for_round(
    caller: Caller,
    peers: Callable[[], Sequence[PeerAddress]],
    t: int,
    *,
    budget_s: float,
    stop: threading.Event,
    beat: Callable[[], None],
    gone_after_s: float | None,
) -> list[str]:
    """Wait until every peer ``peers()`` lists (asked anew each poll) has published snapshot ``t``.

    ``gone_after_s``: a peer whose Hellos have gone unanswered this long counts as done (0: at the first;
    None: never), and one that answers with a refusal (another fleet, a bad certificate, no Hello at
    all) at once; with None a refusal is waited out too. A peer too busy to answer (RESOURCE_EXHAUSTED:
    its calls or call rate per host) is no answer about the round: asked again, as a silent one is.
    Returns the peers still behind when ``budget_s`` ran out (``[]`` when none is).

    Raises:
        Stopped: ``stop`` was set while waiting.
    """
    deadline = time.monotonic() + budget_s
    done: set[str] = set()
    silent_since: dict[str, float] = {}  # peers whose Hellos go unanswered, since when

    def published(peer: PeerAddress) -> bool:
        try:
            reply = caller.hello(peer)
        except PeerUnreachable as exc:
            if gone_after_s is None:
                return False
            if exc.kind not in _TRANSIENT and not exc.transient:  # a busy peer (its host rate) is asked again
                return True
            since = silent_since.setdefault(peer.node_id, time.monotonic())
            return time.monotonic() - since >= gone_after_s
        silent_since.pop(peer.node_id, None)
        return reply.identity.round is not None and reply.identity.round >= t

    while True:
        waiting = {p.node_id: p for p in peers() if p.node_id not in done}
        if not waiting:
            return []
        names = sorted(waiting)
        try:
            answers = run_parallel(published, [waiting[n] for n in names], workers=HELLO_WORKERS, stop=stop,
                                   name="barrier")  # fmt: skip
        except Abandoned:
            raise Stopped from None
        done.update(name for name, ok in zip(names, answers, strict=True) if ok)
        behind = [name for name in names if name not in done]
        if not behind:
            return []
        if stop.is_set():
            raise Stopped
        beat()
        if time.monotonic() > deadline:
            return behind
        stop.wait(POLL_S)
