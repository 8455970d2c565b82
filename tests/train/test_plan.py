"""The start plan: every combination of what a pretraining run can be given, and where its tokenizer, config
and weights then come from (or why it is refused)."""

from __future__ import annotations

import itertools

import pytest

from bertforge.errors import UserError
from bertforge.train.plan import Given, StartPlan, start_plan

FLAGS = ("resume", "checkpointed", "saved_tokenizer", "prepared", "tokenizer", "init", "add_vocab", "model_config")


def _expected(g: Given) -> StartPlan | str:
    """The table of plan.py's docstring, written out again row by row."""
    if g.add_vocab and not g.init:
        return "--add-vocab extends"
    if g.init and g.model_config:
        return "--model-config describes"
    if g.add_vocab and g.prepared and not g.checkpointed:
        return "--add-vocab changes the vocabulary"
    if g.resume and g.checkpointed:
        return StartPlan("out", False, "out", "checkpoint", False, False)
    if g.resume and g.saved_tokenizer:
        tok = "out"
    elif g.prepared:
        tok = "prepared"
    elif g.tokenizer:
        tok = "given"
    elif g.init:
        tok = "init"
    else:
        tok = "trained"
    extend = g.add_vocab and tok in ("given", "init")
    if g.init:
        return StartPlan(tok, extend, "init", "init", g.add_vocab, False)
    return StartPlan(tok, False, "model_config" if g.model_config else "preset", "new", False, True)


@pytest.mark.parametrize("values", list(itertools.product((False, True), repeat=len(FLAGS))))
def test_every_combination_has_its_plan_or_is_refused(values):
    given = Given(**dict(zip(FLAGS, values)))
    want = _expected(given)
    if isinstance(want, str):
        with pytest.raises(UserError, match=want):
            start_plan(given)
    else:
        assert start_plan(given) == want


@pytest.mark.parametrize("given, tokenizer, config, weights", [
    (Given(), "trained", "preset", "new"),
    (Given(tokenizer=True), "given", "preset", "new"),
    (Given(prepared=True, model_config=True), "prepared", "model_config", "new"),
    (Given(init=True), "init", "init", "init"),
    (Given(init=True, tokenizer=True, add_vocab=True), "given", "init", "init"),
    (Given(resume=True, checkpointed=True, saved_tokenizer=True, init=True, add_vocab=True), "out", "out",
     "checkpoint"),
    (Given(resume=True, saved_tokenizer=True, init=True, add_vocab=True), "out", "init", "init"),  # killed early
    (Given(resume=True), "trained", "preset", "new"),  # killed before it saved anything: as a new run
])
def test_the_rows_of_the_table(given, tokenizer, config, weights):
    plan = start_plan(given)
    assert (plan.tokenizer, plan.config, plan.weights) == (tokenizer, config, weights)
    assert plan.continued == (weights == "checkpoint")
    # a run killed after it saved its extended vocabulary grows --init's model to it, without extending it again
    if given.resume and given.saved_tokenizer and not given.checkpointed and given.add_vocab:
        assert plan.grow and not plan.extend_vocab
