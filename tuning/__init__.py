"""Optuna search of launch configurations (installed as ``pycuda_heads.tuning``)."""
