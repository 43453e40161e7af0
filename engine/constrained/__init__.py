"""The grammar backend: the one place that turns a request's constraint into a CompiledGrammar."""

from .grammar_backend import GrammarBackend, InvalidGrammar

__all__ = ["GrammarBackend", "InvalidGrammar"]
