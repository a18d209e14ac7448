"""Matrix-multiplication kernels, one module a kind: ``matmul`` (the tiled GEMM of
Chapter 2, float32 accumulation, exported as :func:`llmnote.kernels.matmul`)."""
