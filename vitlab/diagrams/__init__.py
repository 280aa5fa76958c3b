"""Architecture figures of the chapters, drawn from the models' own configs and shapes.

One module per paper (``vitlab.diagrams.vit.encoder_figure()``, ...). A figure function
takes a preset name, reads its numbers from the config or a traced pass
(:func:`trace_preset`) and returns a :class:`Diagram`; the tests check those numbers.
"""

from vitlab.diagrams._style import KINDS, Diagram, numbers_in, png_size, shape_label
from vitlab.diagrams._trace import trace_preset, trace_shapes

__all__ = ["KINDS", "Diagram", "numbers_in", "png_size", "shape_label", "trace_preset", "trace_shapes"]
