"""Optuna search of launch configurations (installed as ``pycuda_heads.tuning``)."""

#: the sampler the tuner runs unless told otherwise (``--sampler``): the one the stored quality
#: curves choose at 25 trials (a test holds the two together); here, not in ``samplers``, so
#: the command line names it without importing Optuna
DEFAULT_SAMPLER = "tpe-local"
