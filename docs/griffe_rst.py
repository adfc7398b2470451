"""A griffe extension for the Python API page: the docstrings are written in reST
(Sphinx roles, ``::`` before a literal block), the page in Markdown. The roles
become code spans and the ``::`` markers go, so the text reads as written."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|mod|data|attr|meth|exc|obj|const):`~?([^`]+)`")
_MARKER_LINE = re.compile(r"^\s*::\s*$", re.M)
_MARKER_END = re.compile(r"(\S)::$", re.M)


def markdown(text: str) -> str:
    text = _ROLE.sub(r"`\1`", text)
    text = _MARKER_LINE.sub("", text)
    return _MARKER_END.sub(r"\1:", text)


class ReSTToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
