"""Block styles of the named models: a config applies one, then sets the sizes. A style serves
every family whose settings it names (LLaMA's blocks make a decoder, an encoder-decoder or a ViT);
`of(name, family)` keeps the settings that `family` has."""
from transformer_jax.model_config import names
from transformer_jax.models import registry

__all__ = ['of', 'STYLES']

STYLES = {
    # Radford et al. 2019: pre-LN, tanh GELU, learned positions, a tied head, the kernels that
    # write into the residual stream initialized 1 / sqrt(2 num_layers) as large.
    'gpt2': dict(norm='layernorm', norm_eps=1e-5, mlp='gelu_tanh', positions='learned',
                 use_bias=True, tie_embeddings=True, norm_position='pre',
                 scale_residual_init=True),
    'llama': dict(norm='rmsnorm', norm_eps=1e-6, mlp='swiglu', positions='rope', use_bias=False,
                  tie_embeddings=False, norm_position='pre'),
    'bert': dict(norm='layernorm', norm_eps=1e-12, mlp='gelu', positions='learned', use_bias=True,
                 tie_embeddings=True, norm_position='post', embed_norm=True, type_vocab_size=2),
    'vit': dict(norm='layernorm', norm_eps=1e-6, mlp='gelu', positions='learned', use_bias=True,
                norm_position='pre', pool='cls'),
    # Vaswani et al. 2017: post-LN, ReLU, sinusoidal positions, one shared and tied embedding
    # whose rows are scaled by sqrt(d_model) on the way in.
    'transformer': dict(norm='layernorm', norm_eps=1e-6, mlp='relu', positions='sinusoidal',
                        use_bias=True, tie_embeddings=True, scale_embeddings=True,
                        norm_position='post'),
    # Raffel et al. 2020: pre-norm RMS norms without mean or bias (T5's LayerNorm), no biases,
    # a ReLU MLP, relative position biases, unscaled attention logits (the scale is folded into
    # the LeCun-normal initialization of the queries), embeddings of unit variance added
    # unscaled, a tied head whose input is scaled by width^-0.5, and dropout at the one
    # dropout_rate everywhere (the attention probabilities, the MLP's hidden activation and each
    # stack's final-norm output too). T5 1.1: a gated-GELU MLP and an untied head.
    't5': dict(norm='rmsnorm', norm_eps=1e-6, mlp='relu', positions='relative', use_bias=False,
               tie_embeddings=True, scale_tied_head=True, norm_position='pre',
               scale_attention=False, init_std=None, embed_init_std=1.0, scale_embeddings=False,
               attention_dropout=None, mlp_dropout=None, final_dropout=None),
    't5_v1_1': dict(norm='rmsnorm', norm_eps=1e-6, mlp='gated-gelu', positions='relative',
                    use_bias=False, tie_embeddings=False, scale_tied_head=False,
                    norm_position='pre', scale_attention=False, init_std=None,
                    embed_init_std=1.0, scale_embeddings=False, attention_dropout=None,
                    mlp_dropout=None, final_dropout=None),
    # Radford et al. 2022: pre-LN, exact GELU, no bias on the key projections, a tied output.
    'whisper': dict(norm='layernorm', norm_eps=1e-5, mlp='gelu', positions='learned',
                    use_bias=True, key_bias=False, tie_embeddings=True, norm_position='pre'),
}


def of(name: str, family: str) -> dict:
  """The settings of style `name` that `family`'s config has: LLaMA's blocks on a ViT leave out
  tie_embeddings, which a ViT does not have."""
  settings = names(registry.get(family).config)
  return {key: value for key, value in STYLES[name].items() if key in settings}
