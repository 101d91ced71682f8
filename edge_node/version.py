"""The package's version, in a foundation module so that any layer may read it (``edge_node.__version__``
re-exports it; the build reads it here, ``pyproject.toml``)."""

__version__ = "0.1.0"
