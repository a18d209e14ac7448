"""The benchmark harness: CUDA-event timing and the record files in ``assets/benchmarks``.

Run ``python -m llmnote.bench --help`` for the suites.
"""

from .record import META_KEYS, ROW_KEYS, Record, load_record, validate_record
from .timing import cuda_time_ms, rotating_inputs

__all__ = ["META_KEYS", "ROW_KEYS", "Record", "cuda_time_ms", "load_record", "rotating_inputs", "validate_record"]
