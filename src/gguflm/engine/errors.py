"""Errors of requests to the engine, shared by the layers above it (api, server, cli).

``InvalidRequestError`` is defined here, below ``api``, so that engine modules (constraints,
tools) can raise the one error the API and the server already turn into an OpenAI error
object (400, ``param``, ``code``). ``api.InvalidRequestError`` is meant to become this class.
"""

from __future__ import annotations

__all__ = ["ConstraintError", "ConstraintFailure", "InvalidRequestError", "NoTokenAllowed"]


class InvalidRequestError(ValueError):
    """A request the model cannot serve as asked: a bad argument value, a prompt longer than
    the context, a conversation the chat template rejects, a schema or grammar that cannot
    be compiled. ``param`` names the argument (``response_format.json_schema.schema``,
    ``tools[1].function.name``); ``code`` is OpenAI's error code where it has one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ConstraintError(InvalidRequestError):
    """A schema, grammar or tool definition that cannot be enforced: invalid, or using an
    unsupported feature. The message names the problem; ``param`` the request field
    (``response_format.json_schema.schema``, ``grammar``, ``tools``)."""


class ConstraintFailure(RuntimeError):
    """A constraint that broke down while generating (llguidance hit one of its limits, or a
    token outside the mask was accepted): the sequence cannot go on constrained."""


class NoTokenAllowed(ConstraintFailure):
    """Every token is excluded at a step: ``logit_bias`` bans (``false``) all that the grammar
    and ``ignore_eos`` leave. Sampling from nothing has no answer, so the sequence ends in
    this error (a 400 naming ``logit_bias``) instead of drawing from NaN probabilities."""

    param = "logit_bias"
