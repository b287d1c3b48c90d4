"""Stands in for matplotlib in the processes tests start: see tests/lean_site/README.md."""

raise ImportError("matplotlib is left out of the processes tfaccel's tests start (tests/lean_site/README.md)")
