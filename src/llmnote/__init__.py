"""llmnote: the shared package of the llmnote book.

Import it first in every notebook: it picks the device and, without a GPU, switches
Triton to its interpreter before Triton is imported (see :mod:`llmnote.runtime`).
"""

from . import runtime

runtime.configure()

from .show import show  # noqa: E402

__version__ = "0.1.0"
__all__ = ["runtime", "show", "__version__"]
