"""CNN layers with explicit forward/backward over the ops in ibtmpi/ops/,
one module per layer family (conv.py, pool.py, activation.py, linear.py,
dropout.py, norm.py; residual.py, a block of layers), mirroring ops/ and kernels/*.cu), each class registered under
its spec kind in ``LAYERS`` (base.py) by the imports below: adding a layer
is one module and one import line here. fuse.py holds the passes that
combine layers. A layer declares its parameter and buffer shapes; the model
hands it views into its flat vectors (``bind``, ``bind_buffers``). Tests:
tests/unit/test_layer_registry.py, tests/unit/test_model.py and
tests/unit/test_ops.py.
"""
from __future__ import annotations

from .base import LAYERS, REQUIRED, Layer, he_normal, he_std, register, spec_entry
# the registration lines: importing a layer module registers its classes
from .conv import Conv2d
from .pool import AvgPool2d, GlobalAvgPool, MaxPool2d
from .activation import ReLU
from .linear import Flatten, Linear
from .dropout import Dropout
from .norm import BatchNorm2d
from .residual import Residual
from .fuse import commute_relu_pool, fuse_for_device, plan_phase_out

__all__ = ["LAYERS", "REQUIRED", "Layer", "register", "spec_entry", "he_std", "he_normal",
           "Conv2d", "MaxPool2d", "AvgPool2d", "GlobalAvgPool", "ReLU", "Flatten", "Linear",
           "Dropout", "BatchNorm2d", "Residual",
           "commute_relu_pool", "plan_phase_out", "fuse_for_device"]
