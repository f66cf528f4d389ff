"""qconv: weight-quantized (int8/int4) convolution with exact layouts, a numpy oracle, a Cython CPU
engine and OpenCL kernels.

Quick start::

    import numpy as np, qconv
    w = qconv.quantize_weight(np.random.randn(64, 32, 3, 3).astype(np.float32), bits=4, block_size=16)
    layer = qconv.Conv2d(w, padding=1)              # CPU engine, dynamic int8 activations
    y = layer(np.random.randn(1, 32, 28, 28).astype(np.float32))
    ref = qconv.reference.conv2d(x, w, padding=1)   # the oracle
"""
from . import layouts, reference
from .devices import available_devices
from .geometry import ConvSpec
from .layer import Conv2d, Linear, conv2d
from .pipeline import Pipeline, Residual
from .weights import QuantizedWeight, quantize_weight

__version__ = "0.10.0"

__all__ = ["QuantizedWeight", "quantize_weight", "Conv2d", "Linear", "conv2d", "Pipeline", "Residual", "ConvSpec",
           "reference",
           "layouts", "available_devices", "__version__"]
