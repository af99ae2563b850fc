"""Decoding: samplers and cached generation for any module that follows the cache protocol.

    from transformer_jax import decode
    out = decode.generate(model, params, prompt_tokens, max_new_tokens=32)

cache.py       the cache protocol a model follows (decoder, encoder-decoder), the cache, prompts
               of different lengths and the sliding-window ring in it, prefill
samplers.py    greedy, temperature, top-k and top-p over logits
generation.py  generate (prefill + a cached while_loop) and forced_logits (teacher forcing)
beam.py        beam_search under Wu et al. (2016)'s length penalty
text.py        sample_text: text in, text out (--mode=sample)
settings.py    SampleSettings (config.sample) and EvalSettings (config.eval)
"""
from transformer_jax.decode.beam import Beams, beam_search, length_penalty_of
from transformer_jax.decode.cache import (PROTOCOLS, cache_slots, check_inputs, check_positions,
                                          check_window, decoding_of, init_cache, max_positions)
from transformer_jax.decode.generation import Generation, forced_logits, generate
from transformer_jax.decode.samplers import (SAMPLER_RANGES, check_sampler, filter_logits, greedy,
                                             probabilities, sample, top_k_mask, top_p_mask)
from transformer_jax.decode.settings import EvalSettings, SampleSettings
from transformer_jax.decode.text import TextVocab, sample_text

__all__ = [
    'beam_search', 'Beams', 'cache_slots', 'check_inputs', 'check_positions', 'check_sampler',
    'check_window', 'decoding_of', 'EvalSettings', 'filter_logits', 'forced_logits', 'generate',
    'Generation', 'greedy', 'init_cache', 'length_penalty_of', 'max_positions', 'probabilities',
    'PROTOCOLS', 'sample', 'sample_text', 'SAMPLER_RANGES', 'SampleSettings', 'TextVocab',
    'top_k_mask', 'top_p_mask']
