"""An edge-node example: fine-tune a pretrained MobileNetV2-style network (BatchNorm) on a fleet.

``mobilenet_v2`` / ``mobilenet_v2_gn`` are model factories (BatchNorm / GroupNorm), ``first_five`` and
``last_five`` data factories (CIFAR-10 classes 0-4 and 5-9, relabelled 0-4), and ``python -m
mobilenet_finetune.pretrain`` the central pretraining that writes the ``--init-weights`` file.
"""

from mobilenet_finetune.data import first_five, last_five
from mobilenet_finetune.model import mobilenet_v2, mobilenet_v2_gn

__all__ = ["first_five", "last_five", "mobilenet_v2", "mobilenet_v2_gn"]
