"""vitlab: Vision Transformer variants, layer by layer, for the ViT Lab course.

Every model of every family keeps one contract (:class:`vitlab.contract.VisionModel`, timm's
names and meanings): ``forward_features(x)`` returns the tokens after the final norm, not
pooled (one tensor per branch for CrossViT, the last stage's tokens for PiT, LeViT and CvT);
``forward_head(features, pre_logits=False)`` turns them into logits (or, with
``pre_logits``, into the pooled vector the classifier reads); ``forward(x)`` equals
``forward_head(forward_features(x))`` in eval mode; and :func:`vitlab.attention_maps`
returns one labelled ``(B, heads, N_q, N_k)`` map per attention layer in forward order,
each model's docstring saying what its rows and columns index. Each paper file also declares its
``FAMILY`` (:class:`vitlab.contract.FamilyInfo`), from which :mod:`vitlab.family` builds its
tables. ``tests/test_contract.py`` checks all of it for every family.

The modules import one another in one direction only (``tests/test_imports.py`` checks
it): :mod:`vitlab.registry` looks up names, configs and model files;
:mod:`vitlab.pretrained` fetches released weights through the hub and converts them;
:mod:`vitlab.factory` offers ``create_model`` on top of both; :mod:`vitlab.weights` reads
and writes local weight files and imports no other ``vitlab`` module.
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
