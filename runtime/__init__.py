"""tidal.runtime: the inference server that runs in every tidal pod.

Open Inference Protocol v2 over aiohttp, a dynamic batcher per model, a hot/cold engine cache
under a device-memory budget, ONNX Runtime and TensorRT backends, Prometheus metrics and
warm-up before readiness.  Pure decision logic lives in :mod:`tidal.runtime.core`; everything
that touches the network, the disk, the clock or a device lives beside it.

This module imports nothing heavy on purpose: ``bench/gpu_check.py`` imports
:mod:`tidal.runtime.backends.cudamem` on machines that have cuda-python but not pydantic.
"""

__version__ = "0.1.0"
