"""@triton.jit kernels of specdec_ops, one module per family; installed as
``specdec_ops.triton_kernels``. Launchers live in the specdec_ops modules."""
