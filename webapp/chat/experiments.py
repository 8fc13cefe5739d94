"""The glass-box experiments on a chat model's replies, each declared once: what its jobs are called on the
core, which executor runs them, whether they start from a finished reply's kept KV cache, the service its
views call, and its routes. The app factory loops over EXPERIMENTS (webapp/__init__.py): adding an experiment
is one package, webapp/chat/<name>/ (compute.py: its torch work reading the hooked forward; jobs.py: its
request and result types and executor; service.py; pages.py: its routes; view.py), its templates, plus one
line here (docs/architecture.md, "Adding an experiment").

Every experiment's checks (the model that wrote the reply, running here, in nanoGPT's layout) go through
Inside's service, built first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from webapp.chat.ablation import pages as ablation_pages
from webapp.chat.ablation.jobs import AblationJobs
from webapp.chat.ablation.service import AblationService
from webapp.chat.attribution import pages as attribution_pages
from webapp.chat.attribution.jobs import AttributionJobs
from webapp.chat.attribution.service import AttributionService
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.directions import DirectionStore
from webapp.chat.features import dictionary_pages
from webapp.chat.features import pages as feature_pages
from webapp.chat.features.jobs import FeaturesJobs, TextFeaturesJobs
from webapp.chat.features.service import FeatureService
from webapp.chat.features.training import TrainingService
from webapp.chat.features.training_jobs import TrainJobs
from webapp.chat.heads import pages as head_pages
from webapp.chat.heads.jobs import HeadJobs
from webapp.chat.heads.service import HeadService
from webapp.chat.inside import pages as inside_pages
from webapp.chat.inside.jobs import InsideJobs
from webapp.chat.inside.service import InsideService
from webapp.chat.lens import pages as lens_pages
from webapp.chat.lens.jobs import LensJobs
from webapp.chat.lens.service import LensService
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.patching import pages as patching_pages
from webapp.chat.patching.jobs import PatchingJobs
from webapp.chat.patching.service import PatchingService
from webapp.chat.registry import Work
from webapp.chat.service import ChatService
from webapp.chat.steering import pages as steering_pages
from webapp.chat.steering import sweep_pages
from webapp.chat.steering.jobs import DirectionJobs
from webapp.chat.steering.service import SteeringService
from webapp.config import ROOT
from webapp.core import InferenceCore

# (core, chat, inside, settings) -> the service an experiment's views call
ServiceFactory = Callable[[InferenceCore, ChatService, InsideService, Any], object]


@dataclass(frozen=True)
class Experiment:
    """One experiment: its jobs run as kind `work` on the default model and `work:<name>` on another
    (ChatModels.job_kind), by `executor`, one at a time between the replies' batched steps."""

    work: Work
    executor: Callable[[LoadedChatModel, PrefixCache | None], ReplyJobs[Any, Any]]
    service: ServiceFactory | None  # None: another's (Inside's, built before every other; or FEATURES' for texts)
    pages: tuple[ModuleType, ...]  # its routes: imported here, they are on the chat blueprint before create_app
    # registers it
    reads_kept_cache: bool = True  # it starts from a finished reply's kept keys and values, where there are some

    def executor_for(self, loaded: LoadedChatModel, prefix: Callable[[LoadedChatModel], PrefixCache]
                     ) -> ReplyJobs[Any, Any]:
        """This experiment's executor on one loaded model; prefix: the model's shared PrefixCache."""
        kept = prefix(loaded) if self.reads_kept_cache and loaded.supports_kv_cache else None
        return self.executor(loaded, kept)


EXPERIMENTS: tuple[Experiment, ...] = (
    # "Inside this token": the logit lens and every head's attention at one position
    Experiment(Work.INSIDE, InsideJobs, None, pages=(inside_pages,)),
    # switching parts off: a mean ablation's means, one position's odds with parts off
    Experiment(Work.ABLATE, AblationJobs, lambda core, chat, inside, settings: AblationService(core, chat),
               pages=(ablation_pages,), reads_kept_cache=False),
    # "Who pushed this token": direct logit attribution
    Experiment(Work.ATTRIBUTION, AttributionJobs,
               lambda core, chat, inside, settings: AttributionService(core, inside, settings.inside_cache_entries),
               pages=(attribution_pages,)),
    # one head over a whole reply, query × key
    Experiment(Work.HEAD, HeadJobs,
               lambda core, chat, inside, settings: HeadService(core, inside, settings.inside_cache_entries),
               pages=(head_pages,)),
    # "Patch from another question": activation patching
    Experiment(Work.PATCHING, PatchingJobs,
               lambda core, chat, inside, settings: PatchingService(core, inside, settings.inside_cache_entries,
                                                                    settings.patching_max_cells),
               pages=(patching_pages,)),
    # the logit lens over a whole reply
    Experiment(Work.LENS, LensJobs,
               lambda core, chat, inside, settings: LensService(core, inside, settings.inside_cache_entries),
               pages=(lens_pages,)),
    # the features active at a token, by each of the model's sparse dictionaries
    Experiment(Work.FEATURES, FeaturesJobs,
               lambda core, chat, inside, settings: FeatureService(core, inside, settings.inside_cache_entries,
                                                                              chat.store),
               pages=(feature_pages,)),
    # the features of every token of a typed text (a search), on the features service
    Experiment(Work.FEATURE_TEXT, TextFeaturesJobs, None, pages=(feature_pages,), reads_kept_cache=False),
    # a sparse dictionary trained from the page
    Experiment(Work.TRAIN, TrainJobs, lambda core, chat, inside, settings: TrainingService(
        core, chat.models, Path(settings.instance_path or ROOT / "instance")),
               pages=(dictionary_pages,), reads_kept_cache=False),
    # steering: a contrastive direction from two lists of prompts; steered versions run as replies
    Experiment(Work.DIRECTION, DirectionJobs, lambda core, chat, inside, settings: SteeringService(core, chat),
               pages=(steering_pages, sweep_pages), reads_kept_cache=False),
)


def services(core: InferenceCore, chat: ChatService, settings: Any) -> list[object]:
    """Every experiment's service, Inside's first."""
    inside = InsideService(core, chat.models, keep=settings.inside_cache_entries,
                           directions=DirectionStore(chat.store.db))
    return [inside] + [e.service(core, chat, inside, settings) for e in EXPERIMENTS if e.service is not None]
