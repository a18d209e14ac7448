"""The benchmark harness: CUDA-event timing and the suites that write the record files in
``assets/benchmarks`` (the format and its reader: :mod:`llmnote.records`).

Run ``python -m llmnote.bench --help`` for the suites.
"""

from .timing import cuda_time_ms, rotating_inputs

__all__ = ["cuda_time_ms", "rotating_inputs"]
