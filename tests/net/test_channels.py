"""The channel cache: one channel per key while it serves, discarded on failure, bounded and expired."""

from __future__ import annotations

import pytest

from edge_node.net.channels import ChannelCache


class FakeChannel:
    made = 0

    def __init__(self) -> None:
        FakeChannel.made += 1
        self.closed = False

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_channel_that_served_is_reused_and_one_that_failed_is_closed() -> None:
    cache = ChannelCache()
    with cache.lease("a", FakeChannel) as first:
        pass
    with cache.lease("a", FakeChannel) as second:
        pass
    assert second is first and not first.closed and (cache.made, cache.reused) == (1, 1)
    with pytest.raises(RuntimeError), cache.lease("a", FakeChannel):
        raise RuntimeError("the pull failed")
    assert first.closed and len(cache) == 0
    with cache.lease("a", FakeChannel) as third:
        pass
    assert third is not first and cache.made == 2


def test_a_discarded_channel_in_use_by_another_pull_closes_when_that_pull_ends() -> None:
    cache = ChannelCache()
    with cache.lease("a", FakeChannel) as channel:
        with pytest.raises(RuntimeError), cache.lease("a", FakeChannel) as same:
            assert same is channel
            raise RuntimeError("one of two pulls failed")
        assert not channel.closed  # the other pull still reads from it
    assert channel.closed and len(cache) == 0


def test_idle_channels_beyond_the_cap_or_past_idle_s_are_closed() -> None:
    clock = Clock()
    cache = ChannelCache(max_channels=2, idle_s=100.0, clock=clock)
    channels = {}
    for key in "abc":
        with cache.lease(key, FakeChannel) as channels[key]:
            clock.now += 1
    assert channels["a"].closed and not channels["b"].closed and len(cache) == 2  # the least recently used
    clock.now += 100
    with cache.lease("d", FakeChannel):
        assert channels["b"].closed and channels["c"].closed
    with cache.lease("d", FakeChannel), cache.lease("e", FakeChannel), cache.lease("f", FakeChannel):
        assert len(cache) == 3  # in use: never closed, whatever the cap
    assert len(cache) == 2


def test_close_closes_idle_channels_now_and_busy_ones_when_they_end() -> None:
    cache = ChannelCache()
    with cache.lease("idle", FakeChannel) as idle:
        pass
    with cache.lease("busy", FakeChannel) as busy:
        cache.close()
        assert idle.closed and not busy.closed and len(cache) == 0
    assert busy.closed
