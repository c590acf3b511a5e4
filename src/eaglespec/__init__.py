"""eaglespec: lossless speculative decoding with EAGLE draft heads."""

__version__ = "0.1.0"
