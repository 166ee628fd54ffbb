"""Drafters propose tokens for the target to verify. One interface (`Drafter`) for all kinds."""
from .base import Drafter, Guess, Seen, cascade
from .lookup import LookupDrafter, NgramDrafter
from .model import ModelDrafter, PromptWindow

__all__ = ["Drafter", "Guess", "LookupDrafter", "ModelDrafter", "NgramDrafter", "PromptWindow", "Seen",
           "cascade"]
