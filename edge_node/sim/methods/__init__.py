"""The registry of the simulation's learning methods: one :class:`Method` per name (``--method`` lists them in
this order; the report's table puts the dense ones first, as the paper's rows).

Adding a method is one module defining its :class:`Method` (its declarations and its round over all
clients, see :mod:`edge_node.sim.methods.base`) and one entry here; nothing else names it.
"""

from __future__ import annotations

from edge_node.errors import ConfigError
from edge_node.sim.methods.base import Method, RoundResult, RunState, SimContext
from edge_node.sim.methods.dispfl import DISPFL
from edge_node.sim.methods.ditto import DITTO
from edge_node.sim.methods.dpsgd import DPSGD_FT, DPSGD_PLAIN
from edge_node.sim.methods.fedavg import FEDAVG, FEDAVG_FT
from edge_node.sim.methods.fedp3 import FEDP3
from edge_node.sim.methods.fedspa import FEDSPA, FEDSPA_RSM
from edge_node.sim.methods.heterofl import HETEROFL
from edge_node.sim.methods.local import LOCAL
from edge_node.sim.methods.s2s import DISPFL_S2S
from edge_node.sim.methods.sub_fedavg import SUB_FEDAVG

REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        DISPFL,
        DISPFL_S2S,
        LOCAL,
        DPSGD_PLAIN,
        DPSGD_FT,
        FEDAVG,
        FEDAVG_FT,
        FEDP3,
        DITTO,
        FEDSPA,
        FEDSPA_RSM,
        SUB_FEDAVG,
        HETEROFL,
    )
}
# Settings some method uses and others ignore (warned about when given to one that does not use them).
METHOD_SETTINGS = frozenset().union(*(m.uses for m in REGISTRY.values()))


def get_method(name: str) -> Method:
    """The registered method ``name``; ConfigError listing the names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"method {name!r} must be one of {', '.join(REGISTRY)}") from None


def users_of(setting: str) -> list[str]:
    """The registered methods that use ``setting``."""
    return [name for name, m in REGISTRY.items() if setting in m.uses]


__all__ = ["METHOD_SETTINGS", "REGISTRY", "Method", "RoundResult", "RunState", "SimContext", "get_method", "users_of"]
