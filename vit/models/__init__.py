"""Models: attention and the layers around it, the encoder ViT and T2T-ViT share, their registry, and fitting
weights read by vit/weights/read.py to a model (vit/weights/fit.py)."""

from vit.models.attention import Attention, LocalitySelfAttention, RotaryAttention, TokenAttention, capture_attention
from vit.models.classifier import TransformerClassifier
from vit.models.classifier_config import ClassifierConfig
from vit.models.complexity import Complexity, attention_macs, complexity, mlp_macs
from vit.models.layers import Block, DropPath, LayerScale, Mlp, SwiGLU
from vit.models.mae import MAEConfig, MaskedAutoencoder, create_mae
from vit.models.patch_embed import PatchEmbed
from vit.models.pos_embed import resample_pos_embed, sinusoid_table
from vit.models.registry import create_model, list_models
from vit.models.rope import apply_rope, axial_rope_table
from vit.models.rotary_positions import AxialRotary, MixedRotary
from vit.models.t2t import T2TConfig, T2TModule, T2TViT
from vit.models.vit import VisionTransformer, ViTConfig

__all__ = [
    "Attention",
    "AxialRotary",
    "Block",
    "Complexity",
    "DropPath",
    "TransformerClassifier",
    "ClassifierConfig",
    "LayerScale",
    "LocalitySelfAttention",
    "RotaryAttention",
    "MAEConfig",
    "MaskedAutoencoder",
    "MixedRotary",
    "Mlp",
    "PatchEmbed",
    "SwiGLU",
    "T2TConfig",
    "T2TModule",
    "T2TViT",
    "TokenAttention",
    "ViTConfig",
    "VisionTransformer",
    "apply_rope",
    "attention_macs",
    "axial_rope_table",
    "capture_attention",
    "complexity",
    "create_mae",
    "create_model",
    "list_models",
    "mlp_macs",
    "resample_pos_embed",
    "sinusoid_table",
]
