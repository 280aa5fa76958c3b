"""vitlab: Vision Transformer variants, layer by layer, for the ViT Lab course."""

from vitlab.registry import convert_state_dict, create_model, get_config, list_models, set_fused_attention
from vitlab.utils import count_parameters, pick_device, seed_everything
from vitlab.weights import load_checkpoint, load_pretrained, load_state_dict, save_state_dict

__version__ = "0.1.0"

__all__ = [
    "convert_state_dict",
    "count_parameters",
    "create_model",
    "get_config",
    "list_models",
    "load_checkpoint", "load_pretrained", "load_state_dict", "save_state_dict",
    "pick_device",
    "seed_everything",
    "set_fused_attention",
]
