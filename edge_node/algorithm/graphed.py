"""One masked SGD step of :func:`~edge_node.algorithm.training.train_masked`, captured once as a CUDA graph.

A step of a small model is hundreds of small kernel launches; on a GPU the CPU issuing them is the
bottleneck, and replaying them as one CUDA graph removes it (docs/RESULTS.md: 1.76x for resnet18, 1.45x for
cnn with graphs). The graph holds the eager step's own kernels, captured by ``torch.cuda.graph`` (no
compiler): forward, mean cross-entropy, ``torch.autograd.grad``, clipping, weight decay, ``w -= lr * g``,
``w *= mask`` and the loss sum. Everything it reads or writes lives at a fixed address: the batch buffers
(each batch is copied in), the mask buffers (copied in once per ``train_masked`` call), the learning rate
(a 0-dim device tensor: it changes every round), the loss sum, and the model's parameters, updated in
place (the simulation loads each client's weights into the same tensors). The result equals the eager
step up to float rounding (``w - lr * g`` is rounded once more; convolution algorithms may differ).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from edge_node.algorithm.frozen import train_mode
from edge_node.algorithm.training import SGDConfig, masked_update

WARMUP_STEPS = 3  # on a side stream before capture, as torch's CUDA graph documentation asks


class GraphedStep:
    """Whole-step replay for one model, one batch shape and one SGD config (lr aside); a ``StepReplay``.

    Args:
        model: its parameters must stay the same tensors (load weights with ``load_weights``).
        batch_shape: the input batch's shape, batch size first; other shapes run the eager step.
        config: clip_norm and weight_decay are captured; DP-SGD and micro-batch slices are refused.
        capture: False runs the same step function uncaptured, from the same buffers (what a CPU test checks).

    Raises:
        ValueError: a config or model a graph cannot replay (one line saying why).
    """

    def __init__(self, model: nn.Module, batch_shape: Sequence[int], config: SGDConfig, *, capture: bool = True):
        params: list[torch.Tensor] = [p for _, p in model.named_parameters()]
        if not params:
            raise ValueError("a model without parameters has no step to capture")
        if config.dp is not None:
            raise ValueError("DP-SGD steps (per-sample gradients) are not captured as CUDA graphs")
        if 0 < config.micro_batch < batch_shape[0]:
            raise ValueError(f"micro_batch={config.micro_batch} slices the batch; CUDA graphs need micro_batch 0")
        device = params[0].device
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {device}")
        self.model = model
        self.batch_shape = tuple(int(n) for n in batch_shape)
        self.config = SGDConfig(
            lr=config.lr, weight_decay=config.weight_decay, clip_norm=config.clip_norm, task=config.task
        )
        self._params = params
        self._addresses = [p.data_ptr() for p in params]
        self._x = torch.zeros(self.batch_shape, dtype=params[0].dtype, device=device)
        self._y = torch.zeros(self.batch_shape[0], dtype=torch.long, device=device)
        self._masks = [torch.ones_like(p) for p in params]
        self._lr = torch.zeros((), dtype=params[0].dtype, device=device)
        self._loss_sum = torch.zeros((), device=device)
        self._graph = self._capture() if capture else None
        self.replays = 0  # steps replayed so far (what a check reads: were batches replayed at all?)

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def check(self, model: nn.Module, config: SGDConfig, proximal: bool) -> None:
        """Raise ValueError unless this call of ``train_masked`` is the one captured (lr aside)."""
        if model is not self.model:
            raise ValueError("this CUDA graph was captured for another model")
        if [p.data_ptr() for p in model.parameters()] != self._addresses:
            raise ValueError("the model's parameters were replaced since capture (load weights in place)")
        if config.dp is not None or proximal:
            raise ValueError("the captured step has no DP-SGD and no proximal term")
        if 0 < config.micro_batch < self.batch_shape[0]:
            raise ValueError(f"micro_batch={config.micro_batch} slices the batch; the captured step does not")
        if (config.clip_norm, config.weight_decay) != (self.config.clip_norm, self.config.weight_decay):
            raise ValueError(
                f"captured with clip_norm={self.config.clip_norm}, weight_decay={self.config.weight_decay}; "
                f"called with {config.clip_norm}, {config.weight_decay}"
            )

    def load(self, masks: Sequence[torch.Tensor], lr: float) -> None:
        """Copy a call's masks (the parameters' dtype) and learning rate in; zero the loss sum."""
        with torch.no_grad():
            for dst, src in zip(self._masks, masks, strict=True):
                dst.copy_(src)
            self._lr.fill_(lr)
            self._loss_sum.zero_()

    def fits(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the batch ``(x, y)`` has the captured shape, dtype and device (else: the eager step)."""
        return (
            tuple(x.shape) == self.batch_shape
            and x.dtype == self._x.dtype
            and x.device == self._x.device
            and tuple(y.shape) == (self.batch_shape[0],)
            and y.dtype == self._y.dtype
            and y.device == self._y.device
        )

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step on the batch ``(x, y)`` (which :meth:`fits`): parameters updated, loss added to the sum."""
        with torch.no_grad():
            self._x.copy_(x)
            self._y.copy_(y)
        self.replays += 1
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step()

    @property
    def loss_sum(self) -> torch.Tensor:
        """Sum of loss x batch size over the steps since :meth:`load` (a device tensor; read it before the next)."""
        return self._loss_sum

    def _step(self) -> None:
        """The captured step: train_masked's, on the static buffers."""
        loss = self.config.task.loss(self.model(self._x), self._y)
        grads = list(torch.autograd.grad(loss, self._params))
        with torch.no_grad():
            masked_update(self._params, grads, self._masks, self.config, self._lr)
            self._loss_sum += loss.detach() * self.batch_shape[0]

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream, capture one step, and put the parameters back as they were."""
        state = [t.detach().clone() for t in self._state()]
        train_mode(self.model)
        current = torch.cuda.current_stream(self._x.device)
        side = torch.cuda.Stream(self._x.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        with torch.no_grad():
            for dst, src in zip(self._state(), state, strict=True):
                dst.copy_(src)
            self._loss_sum.zero_()
        return graph

    def _state(self) -> list[torch.Tensor]:
        """What a step may change besides the buffers: parameters, and buffers should a model have any."""
        return [*self._params, *self.model.buffers()]
