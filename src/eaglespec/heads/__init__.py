"""EAGLE draft heads: the module, checkpoints with official key names, reduced draft vocabulary."""
