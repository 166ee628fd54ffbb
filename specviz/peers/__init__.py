"""The decoders specviz is measured against: llama.cpp's programs (llama_cpp), transformers' `generate()` plain,
assisted and with prompt lookup (hf), and the reference speed every speed-up is also given against (reference). It
may import models/ and decode/."""
