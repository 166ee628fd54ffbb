"""Drafters propose tokens for the target to verify. One interface (`Drafter`, base.py) for all kinds: a model
(model.py), and the stages that cost no forward (ngram.py: a trigram table, context lookup)."""
from .base import Drafter, Guess, Seen, cascade
from .ngram import LookupDrafter, NgramDrafter
from .model import ModelDrafter, PromptWindow

__all__ = ["Drafter", "Guess", "LookupDrafter", "ModelDrafter", "NgramDrafter", "PromptWindow", "Seen",
           "cascade"]
