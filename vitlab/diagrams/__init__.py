"""Architecture figures of the chapters, drawn from the models' own configs and shapes.

Each chapter's figure has one function in a module of this package named after the
chapter's paper (``vitlab.diagrams.vit.encoder_figure()``, ...). A figure function takes a
preset name, reads the numbers it writes (tokens, widths, heads, depths) from
``vitlab.get_config`` or from a forward pass traced with :func:`trace_preset`, and
returns a :class:`Diagram`; ``tests/test_diagrams.py`` checks those numbers against the
model, so a figure cannot drift from the code it shows. ``_style`` holds the one visual
language the figures share.
"""

from vitlab.diagrams._style import KINDS, Diagram, numbers_in, png_size, shape_label
from vitlab.diagrams._trace import trace_preset, trace_shapes

__all__ = ["KINDS", "Diagram", "numbers_in", "png_size", "shape_label", "trace_preset", "trace_shapes"]
