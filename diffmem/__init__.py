"""diffmem: measure when diffusion models start to copy their training data.

A library (this package, one module per stage) and thin entry points (``diffmem <verb>``, see ``diffmem.cli``).
"""
__version__ = "0.4.0"
