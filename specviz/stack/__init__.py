"""A run's loaded target and drafters, and what they run: `Stack` (stack), loading the drafts and their n-gram tables
(load, auto_trigram, draft_precision, draft_vocabulary), how quantized drafts read prompts (prompt_reads), compiled
models (compiled), the plans made from the cost curves (plans), the strategies and their default trees (strategies),
and the named stacks (presets). It may import models/, profile/, decode/, backends/ and cpu/."""
