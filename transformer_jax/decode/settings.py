"""The typed settings of decoding: config.sample (what --mode=sample writes) and config.eval (how
an encoder-decoder's held-out outputs are decoded at each evaluation)."""
import dataclasses

from transformer_jax.decode.samplers import SAMPLER_RANGES
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import COUNT, Range
from transformer_jax.settings import Settings, check_templates

__all__ = ['EvalSettings', 'SampleSettings']


@dataclasses.dataclass(frozen=True)
class SampleSettings(Settings):
  """The keys of config.sample, what decode.sample_text reads."""
  SECTION = 'sample'
  prompt: str = 'ROMEO:'  # continued by a decoder; an encoder-decoder's input
  audio: str | None = None  # a speech model's input instead: the audio file it transcribes
  max_new_tokens: int = 256
  temperature: float = 0.8  # 0: greedy
  top_k: int = 0  # 0: every token
  top_p: float = 1.0  # 1: every token
  seed: int = 0
  num_samples: int = 1  # drawn in one batch, or the best of beam_size beams
  # Each new token attends to its last `window` tokens; unset: data.seq_len, the context the run
  # trained on; 0: all.
  window: int | None = None
  # beam_size > 0: the num_samples best outputs of a beam search (decode.beam_search) ranked by
  # log-probability over Wu et al. (2016)'s length penalty ((5 + length) / 6) ** length_penalty,
  # instead of samples (temperature, top_k and top_p then unused).
  beam_size: int = 0
  length_penalty: float = 0.6
  # int8 weights and activations (quantization.int8_params), as CTranslate2's int8: on a CPU with
  # AVX-512 VNNI or AMX its products run several times as fast; logits move by about 1-2%.
  int8: bool = False

  RANGES = {
      'max_new_tokens': COUNT,
      **{name: valid for name, (valid, _) in SAMPLER_RANGES.items()},
      'seed': Range(0, integer=True),
      'num_samples': COUNT,
      'window': Range(0, integer=True, optional=True),
      'beam_size': Range(0, integer=True),
      'length_penalty': Range(0),
  }

  def check(self) -> None:
    super().check()
    if self.beam_size and self.num_samples > self.beam_size:
      raise ConfigError(f'sample.num_samples={self.num_samples} beams of sample.beam_size='
                        f'{self.beam_size}: a beam search returns at most beam_size outputs; '
                        'raise sample.beam_size or lower sample.num_samples.')


@dataclasses.dataclass(frozen=True)
class EvalSettings(Settings):
  """The keys of config.eval: an encoder-decoder's held-out outputs, decoded at each evaluation
  for eval_exact_match (and a translation's eval_bleu), greedily or, with beam_size > 0, as the
  best beam of decode.beam_search under its length penalty."""
  SECTION = 'eval'
  beam_size: int = 0  # 0: greedy
  length_penalty: float = 0.6  # the exponent of Wu et al. (2016)'s length penalty
  # A dual encoder's zero-shot classification (data.image_text) at each evaluation, as
  # eval_zero_shot_accuracy and eval_zero_shot_top5: the images of a TFDS image-classification
  # dataset's split (the first zero_shot_examples; unset: all) against its classes, each the
  # mean embedding of the prompts zero_shot_templates make of its name (its ClassLabel's names,
  # or zero_shot_classes in label order). Unset dataset: none.
  zero_shot_dataset: str | None = None
  zero_shot_split: str = 'test'
  zero_shot_classes: tuple[str, ...] = ()
  zero_shot_templates: tuple[str, ...] = ('a photo of a {}.',)
  zero_shot_examples: int | None = None

  RANGES = {'beam_size': Range(0, integer=True), 'length_penalty': Range(0),
            'zero_shot_examples': Range(1, integer=True, optional=True, example=1000)}

  def check(self) -> None:
    super().check()
    check_templates(self.zero_shot_templates, 'eval.zero_shot_templates')
