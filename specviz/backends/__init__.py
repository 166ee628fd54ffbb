"""The caches behind a model, and the one interface the round asks of them: `ModelCache` and the `Backend` that makes
one (interface), what every cache kind shares (kv), one module per kind (dynamic: transformers' dynamic cache; static:
a static cache for compiled models; own: specviz's CPU forward), and `open_cache`, which chooses the kind (choose). Only
its interface is imported by decode/; it may import cpu/."""
