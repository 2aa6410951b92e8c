"""Chat formats: how each model family's template is rendered and its replies are read.

``ChatFormat(template_text)`` recognises the family from what the template contains (as
llama.cpp's chat layer does), renders conversations the way llama.cpp does (tools through
the template's own ``tools`` variable, history tool-call arguments as objects where the
template reads them so, ``strftime_now`` pinned by ``now``) and parses a model's reply into
``content``, ``reasoning_content`` and ``tool_calls`` in the family's own syntax.

Every family lives in one place: its entry in ``detect.FAMILIES`` (how it is recognised)
and its parser module; nothing outside this package asks which family a template is.
"""

from __future__ import annotations

from .format import ChatFormat

__all__ = ["ChatFormat"]
