"""xrun's benchmarks: xrun side by side with torchrun (and TorchX where installed) and with the
floor (the same workers spawned directly). Run ``python -m benchmarks`` (``--smoke`` for CI).
"""
