"""Speculative decoding: drafters propose tokens, one target forward verifies them all.

``drafters.py`` (n-gram / prompt lookup, the grammar as a drafter, their combination),
``draft_model.py`` (a smaller causal LM, or the target's own first layers), ``verify.py``
(rejection sampling that keeps the target's distribution), ``worker.py`` (what the scheduler
calls: plan drafts, build the verification rows, verify, adapt each request's draft length).
"""
