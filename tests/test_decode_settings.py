"""The typed settings of decoding: config.sample and config.eval, checked when they are made."""
import math

import pytest

from transformer_jax import config_lib, decode
from transformer_jax.errors import ConfigError


@pytest.mark.parametrize('settings,section', [(decode.SampleSettings, 'sample'),
                                              (decode.EvalSettings, 'eval')])
def test_the_defaults_are_the_base_configs_section(settings, section):
  config = config_lib.base_config()
  assert settings.SECTION == section
  assert settings.defaults() == config[section].to_dict()
  assert settings.of(config[section]) == settings()


def test_a_section_reads_into_its_settings():
  config = config_lib.base_config()
  config.sample.update(prompt='to be', temperature=0.0, window=0, beam_size=3, num_samples=2)
  config.eval.beam_size = 4
  sample = decode.SampleSettings.of(config.sample)
  assert (sample.prompt, sample.temperature, sample.window, sample.beam_size,
          sample.num_samples, sample.max_new_tokens) == ('to be', 0.0, 0, 3, 2, 256)
  assert decode.EvalSettings.of(config.eval) == decode.EvalSettings(beam_size=4,
                                                                    length_penalty=0.6)
  with pytest.raises(ConfigError, match=r"Unknown sample settings \['temprature'\]"):
    decode.SampleSettings.of({'temprature': 0.5})


# (settings, key, value without meaning, a value the message offers in its place)
BAD = [
    (decode.SampleSettings, 'max_new_tokens', 0, 256),
    (decode.SampleSettings, 'temperature', -1.0, 0.8),
    (decode.SampleSettings, 'temperature', math.nan, 0.8),
    (decode.SampleSettings, 'top_k', -1, 0),
    (decode.SampleSettings, 'top_k', 2.5, 0),
    (decode.SampleSettings, 'top_p', 0.0, 1.0),
    (decode.SampleSettings, 'top_p', 1.5, 1.0),
    (decode.SampleSettings, 'seed', -1, 0),
    (decode.SampleSettings, 'num_samples', 0, 1),
    (decode.SampleSettings, 'window', -4, 0),
    (decode.SampleSettings, 'window', 1.5, 0),
    (decode.SampleSettings, 'beam_size', -1, 0),
    (decode.SampleSettings, 'length_penalty', -0.5, 0.6),
    (decode.EvalSettings, 'beam_size', 2.5, 0),
    (decode.EvalSettings, 'length_penalty', math.inf, 0.6),
]


@pytest.mark.parametrize('settings,key,value,example', BAD)
def test_a_value_without_meaning_fails_naming_its_key_and_one_that_works(settings, key, value,
                                                                         example):
  name = f'{settings.SECTION}.{key}'
  with pytest.raises(ConfigError, match=rf'^{name}={value!r} must be .*: for example '
                                        rf'--config\.{name}={example}\.$'):
    settings(**{key: value})


def test_the_edges_of_each_range_are_valid():
  sample = decode.SampleSettings(temperature=0.0, top_k=0, top_p=1.0, seed=0, window=0,
                                 beam_size=0, length_penalty=0.0)
  assert sample.temperature == 0.0 and sample.window == 0
  assert decode.EvalSettings(beam_size=0, length_penalty=0.0).beam_size == 0


def test_more_samples_than_beams_fail_naming_both_keys():
  assert decode.SampleSettings(beam_size=3, num_samples=3).num_samples == 3
  with pytest.raises(ConfigError, match=r'^sample\.num_samples=4 beams of sample\.beam_size=3: '
                                        r'.* raise sample\.beam_size or lower sample\.num_samples'):
    decode.SampleSettings(beam_size=3, num_samples=4)
