"""The bus under other training loops: your own, PyTorch Lightning's, Hugging Face's.

:class:`Bus` is importable from here and from ``trainbus``; the bridges are imported
from their modules, which import their library (``trainbus.integrations.lightning``
needs ``trainbus[lightning]``, ``trainbus.integrations.hf`` needs ``trainbus[hf]``).
See ``docs/integrations.md``.
"""

from __future__ import annotations

from trainbus.integrations.loop import Bus as Bus

__all__ = ("Bus",)
