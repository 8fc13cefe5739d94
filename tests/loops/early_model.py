"""A second scripted Loop-lab model that errs from loop 4 on, for the model picker's tests
(GLASSBOX_LOOP_EXTRA_MODELS=early=tests.loops.early_model:load)."""

import os

from tests.support.loop_models import Bundle, Script, ScriptedLoopModel


def load():
    delay = float(os.environ.get("GLASSBOX_TEST_LOOP_DELAY", "0"))
    return Bundle(ScriptedLoopModel(Script(wrong_at=set(range(4, 300)), delay=delay)), checkpoint_id="test:early")
