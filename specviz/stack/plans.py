"""What a stack plans from this machine's cost curves: staged's tree plan (specviz/decode/costs.py) as stored, the specs
it fills in, and the planner of each round (specviz/decode/planner.py) with the model pair's stored calibration."""
from __future__ import annotations

from dataclasses import replace

from ..models.load import LoadedModel
from ..profile.store import Profile
from ..decode.calibration import Calibration
from ..decode.planner import Costs, RoundPlanner
from ..decode.sampling import Sampling
from .strategies import CHAIN_LENGTH
from ..decode.tree import TreeSpec
from ..decode.costs import DRAFT_FEED, TreePlan, key as plan_key
from ..profile.tree_plans import stored_plan
from .draft_vocabulary import DraftVocabulary
from .prompt_reads import PromptReads


class StackPlans:
    def __init__(self, profile: Profile, target: LoadedModel, drafts: list[str], staged: list[str],
                 loaded: dict[str, object], vocabulary: DraftVocabulary, prompt_reads: PromptReads):
        """The parts of a stack its plans are made from: the machine's profile, the target, the drafter specs (top
        stage first), staged's specs (none where the stack cannot run staged) and what each spec loaded, the drafts'
        vocabulary, and how the drafts read prompts (the last two are read at each call: prepare and the bench take up
        stored prompt readers after the stack is made)."""
        self.profile, self.target, self.drafts, self.loaded = profile, target, drafts, loaded
        self.vocabulary, self.prompt_reads = vocabulary, prompt_reads
        self.plans: dict[str, TreePlan] = {}    # tree_plan()'s answer, once read, by name()
        # the specs are the stack's for good; what each loaded may be replaced (a test's re-quantised draft)
        self.top_spec = staged[0] if staged else None

    def top_draft(self) -> LoadedModel | None:
        """The draft model staged's plan pairs with the target: the top stage, where the stack can run staged and
        that stage is a model."""
        draft = self.loaded.get(self.top_spec)
        return draft if isinstance(draft, LoadedModel) else None

    def name(self) -> str | None:
        """The key staged's plan is stored under (tree_plan.key), None where the stack cannot run staged."""
        draft = self.top_draft()
        if draft is None:
            return None
        return plan_key(self.target.short_name, self.target.dtype, draft.short_name, draft.dtype)

    def pin(self, plan: TreePlan) -> None:
        """Plan from `plan` (curves given by hand: a test, a sweep) instead of the stored one; nothing is stored."""
        if self.name() is not None:
            self.plans[self.name()] = plan

    def tree_plan(self) -> TreePlan | None:
        """This machine's plan for staged's tree, as stored (measured and stored first where there is none while
        prepare runs). None where the top stage is no model, or nothing is stored."""
        return self._named_plan(self.name())

    def _named_plan(self, name: str | None) -> TreePlan | None:
        """tree_plan() for the stack's plan key `name` (name() once per decoder made: it walks the stack's drafts)."""
        if name is None:
            return None
        if name not in self.plans:
            draft = self.top_draft()
            plan = stored_plan(self.profile, name, self.target.model, draft.model, self.vocabulary.for_draft(draft, []))
            if plan is None:
                return None
            self.plans[name] = plan
        return self.plans[name]

    def planned(self, tree: TreeSpec) -> TreeSpec:
        """A planned spec with this machine's stored minimum scores filled in, its budget and depth within what its
        curves allow (others as they are; a planned one where no plan is stored grows the fixed rule: staged's minimum
        score, speculative's chain of CHAIN_LENGTH)."""
        return _filled(tree, self.tree_plan() if tree.planned and not tree.min_scores else None)

    def for_decoder(self, strategy: str, tree: TreeSpec, sampling: Sampling) -> tuple[TreeSpec, RoundPlanner | None]:
        """The tree a decoder runs (planned) and the planner of its rounds, from one reading of the stored plan.
        Speculative's and staged's rounds are planned from this machine's curves and a calibration that starts from
        the pair's stored one; other strategies, specs not planned, and stacks with no curves stored get no planner.
        The calibration a run ends with is stored for the next only where the pair's curves are stored too: a stack
        given curves by hand (a test, a sweep) leaves the machine's store alone."""
        name = self.name() if tree.planned else None
        plan = self._named_plan(name)
        tree = _filled(tree, None if tree.min_scores else plan)
        if plan is None or strategy not in ("speculative", "staged"):
            return tree, None
        key = name.replace("tree plan", f"calibration of {strategy}, {'greedy' if sampling.greedy else 'sampled'}", 1)
        stored = self.profile.stored(key, measured=False)
        learn_as = key if self.profile.stored(name) is not None else None
        costs = Costs.of(plan, DRAFT_FEED if strategy == "staged" else 1,
                         reader=self.prompt_reads.timed_reader(self.drafts[0]))
        return tree, RoundPlanner(costs, Calibration(stored if isinstance(stored, dict) else None), learn_as=learn_as)


def _filled(tree: TreeSpec, plan: TreePlan | None) -> TreeSpec:
    """planned()'s spec for a plan read (None: none stored, or the spec's scores were given)."""
    if plan is not None:
        return plan.tree(tree)
    if tree.planned and not tree.min_scores and tree.shape == "chain":
        return replace(tree, budget=CHAIN_LENGTH, max_depth=CHAIN_LENGTH)
    return tree


def keep_learnt(decoder, profile: Profile) -> None:
    """Store in `profile` what a finished generation's planner learnt, for the next run to start from: called by
    whoever ran it (the CLI, the bench, the app), after its clock stopped."""
    planner = decoder.planner
    if decoder.finished and planner is not None and planner.learn_as is not None:
        profile.learnt(planner.learn_as, planner.calibration.to_store())
        planner.learn_as = None
