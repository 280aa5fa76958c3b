"""vitlab: Vision Transformer variants, layer by layer, for the ViT Lab course.

Every model keeps one contract (:class:`vitlab.contract.VisionModel`, timm's names and
meanings: ``forward_features``, ``forward_head``, ``forward``), and
:func:`vitlab.attention_maps` returns its labelled maps in forward order. The modules import
one another in one direction only (``tests/test_imports.py``): :mod:`vitlab.registry` looks
up presets, :mod:`vitlab.pretrained` fetches released weights, :mod:`vitlab.factory` offers
``create_model`` on both, :mod:`vitlab.weights` reads and writes local weight files.
"""

from vitlab.attention_maps import attention_maps
from vitlab.contract import AttentionMap, VisionModel
from vitlab.factory import create_model
from vitlab.registry import convert_state_dict, get_config, list_models, set_fused_attention
from vitlab.utils import count_parameters, pick_device, seed_everything
from vitlab.weights import load_checkpoint, load_state_dict, save_state_dict

__version__ = "0.1.0"

__all__ = [
    "attention_maps",
    "AttentionMap",
    "convert_state_dict",
    "count_parameters",
    "create_model",
    "get_config",
    "list_models",
    "load_checkpoint",
    "load_state_dict",
    "save_state_dict",
    "pick_device",
    "seed_everything",
    "set_fused_attention",
    "VisionModel",
]
