"""An edge-node plug-in: a small MLP on scikit-learn's handwritten digits, read as 64-feature tabular rows.

``mlp`` is the model factory (``--model digits_tabular:mlp``, or ``--model digits-mlp`` through the
``edge_node.models`` entry point) and ``digits`` the data factory (``--dataset digits_tabular:digits``).
Nothing here is specific to images: the same two functions fit sensor windows or audio features.
``diabetes`` (``--task regression``) and ``digit_traits`` (``--task multilabel``) are data factories for the
other tasks, trained by the same ``mlp``.
"""

from digits_tabular.data import digits
from digits_tabular.model import mlp
from digits_tabular.tasks import diabetes, digit_traits

__all__ = ["diabetes", "digit_traits", "digits", "mlp"]
