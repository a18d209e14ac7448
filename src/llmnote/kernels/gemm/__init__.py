"""Matrix-multiplication kernels, one module a kind: ``matmul`` (the tiled GEMM of
Chapter 2, float32 accumulation, exported as :func:`llmnote.kernels.matmul`); ``w4a16``
(Chapter 5: 4-bit weights with group scales times 16-bit activations, a GEMV-like decode
kernel with split-K and a tiled GEMM that dequantize in registers, exported as
:func:`llmnote.kernels.w4a16_linear`)."""
