"""CUDA sources of pycuda-heads (installed as the package data ``pycuda_heads.cu``)."""
