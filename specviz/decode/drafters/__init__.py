"""Drafters propose tokens for the target to verify. One interface (`Drafter`) for all kinds."""
from .base import Drafter
from .lookup import LookupDrafter
from .model import ModelDrafter, PromptWindow
from .ngram import NgramDrafter

__all__ = ["Drafter", "LookupDrafter", "ModelDrafter", "NgramDrafter", "PromptWindow"]
