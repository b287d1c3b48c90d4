"""A griffe extension for the API reference (mkdocs.yml): tfaccel's docstrings title their doctest section
``Example:``, which griffe's Google parser reads as a plain admonition (its ``>>>`` lines would render as prose);
read it as the ``Examples:`` section it is, so the examples render as Python console code."""

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^Example:$", flags=re.M)


class ExampleSections(griffe.Extension):
    """Renames the ``Example:`` section of every docstring to ``Examples:``."""

    def on_instance(self, *, obj: Any, **_: Any) -> None:
        """Called by griffe for every object it loads."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub("Examples:", obj.docstring.value)
