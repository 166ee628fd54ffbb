"""Drafters propose tokens for the target to verify. One interface (`Drafter`) for all kinds."""
from .base import Drafter, Guess, Seen, cascade
from .lookup import LookupDrafter
from .model import ModelDrafter, PromptWindow
from .ngram import NgramDrafter

__all__ = ["Drafter", "Guess", "LookupDrafter", "ModelDrafter", "NgramDrafter", "PromptWindow", "Seen",
           "cascade"]
