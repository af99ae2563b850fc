"""Every config value is checked before anything is read or compiled, with one message that names
the key and a value that works; a workdir's saved config is the default for later commands."""
import json
import math
import os
import subprocess
import sys

import pytest

from helpers import CONFIG_FILES, ROOT, load_config
from process_env import process_env
from train_helpers import small_config
from transformer_jax import (accounting, config_lib, data, decode, lora, model_config, models,
                             run, settings, train)
from transformer_jax.errors import ConfigError
from transformer_jax.train import metrics

LLAMA = ROOT / 'configs' / 'llama_shakespeare.py'
NAN = math.nan
# (key, malformed value): zero, negative, NaN and infinite values where they have no meaning.
MALFORMED = [
    ('optimizer.learning_rate', 0.0), ('optimizer.learning_rate', -3e-3),
    ('optimizer.learning_rate', NAN), ('optimizer.learning_rate', math.inf),
    ('optimizer.b1', NAN), ('optimizer.b1', 1.0), ('optimizer.b2', -0.1), ('optimizer.eps', 0.0),
    ('optimizer.eps', NAN), ('optimizer.weight_decay', -0.1), ('optimizer.weight_decay', NAN),
    ('optimizer.grad_clip_norm', -1.0), ('optimizer.grad_clip_norm', NAN),
    ('optimizer.warmup_steps', -1), ('optimizer.min_lr_ratio', 1.5),
    ('optimizer.min_lr_ratio', NAN), ('training.steps', 0), ('training.steps', -5),
    ('training.log_every', 0), ('training.eval_every', 0), ('training.checkpoint_every', 0),
    ('training.checkpoint_every', -3), ('training.keep_checkpoints', 0),
    ('training.keep_checkpoints', -3), ('training.grad_accum_steps', 0),
    ('training.label_smoothing', 1.0), ('training.label_smoothing', NAN),
    ('training.peak_flops_per_device', -1.0), ('data.seq_len', 0), ('data.batch_size', 0),
    ('data.batch_size', -32), ('data.eval_batch_size', 0), ('data.eval_steps', 0),
    ('data.eval_steps', -2), ('data.mlm_probability', 0.0), ('data.mlm_probability', NAN),
    ('data.num_threads', -1), ('seed', -1), ('sample.temperature', -1.0),
    ('sample.temperature', NAN), ('sample.top_k', -1), ('sample.top_p', 0.0),
    ('sample.top_p', NAN), ('sample.max_new_tokens', 0), ('sample.num_samples', 0),
    ('model.d_ff', -3), ('model.d_ff', 0), ('model.norm_eps', 0.0), ('model.norm_eps', NAN),
    ('model.norm_eps', -1e-5), ('model.rope_base', NAN), ('model.rope_base', -10000.0),
    ('model.rope_base', 1.0), ('model.init_std', NAN), ('model.init_std', -0.02),
    ('model.embed_init_std', NAN), ('model.dropout_rate', 1.0), ('model.dropout_rate', NAN),
    ('model.width', 0), ('model.num_layers', -1), ('model.num_heads', 0),
    ('model.num_kv_heads', 0), ('model.max_len', 0), ('model.vocab_size', -65),
]


def set_key(config, key, value):
  section, _, name = key.rpartition('.')
  (config[section] if section else config)[name] = value


@pytest.mark.parametrize('key,value', MALFORMED, ids=[f'{k}={v}' for k, v in MALFORMED])
def test_a_malformed_value_fails_naming_the_key_and_a_value_that_works(key, value):
  config = load_config(LLAMA)
  set_key(config, key, value)
  with pytest.raises(ConfigError) as error:
    train.resolve(config)
  message = str(error.value)
  assert message.startswith(key) and f'--config.{key}=' in message
  working = message.rpartition(f'--config.{key}=')[2].rstrip('.')
  set_key(config, key, type(value)(working) if value is not None else working)
  train.resolve(config)  # the value the message suggests is accepted


def test_every_numeric_key_has_a_range():
  sections = [settings.TrainingSettings, settings.OptimizerSettings, lora.LoraSettings,
              decode.SampleSettings, decode.EvalSettings, data.DataSettings,
              *data.settings.parts().values()]
  for section in sections:
    kinds = section.placeholder_types()
    numeric = {name for name, default in section.defaults().items()
               if isinstance(default, (int, float)) and not isinstance(default, bool)
               or kinds.get(name) in (int, float)}
    assert numeric <= set(section.RANGES), (section.__name__, sorted(numeric - set(section.RANGES)))
  assert set(config_lib.RANGES) == {'seed'}
  for family in models.registry.names():
    config_class = models.registry.get(family).config
    model_numeric = {name for name, value in model_config.defaults(config_class).items()
                     if isinstance(value, (int, float)) and not isinstance(value, bool)}
    model_numeric |= {'num_decoder_layers', 'num_kv_heads', 'd_ff', 'init_std'}  # None by default
    model_numeric &= set(model_config.names(config_class))
    missing = sorted(model_numeric - set(config_class.RANGES))
    assert not missing, (family, missing)


@pytest.mark.parametrize('path', CONFIG_FILES, ids=[p.stem for p in CONFIG_FILES])
def test_every_shipped_config_is_valid(path):
  train.resolve(load_config(path))


def test_bad_settings_stop_before_anything_is_written_or_compiled(tmp_path):
  for overrides, key in [({'optimizer.grad_clip_norm': -1.0}, 'optimizer.grad_clip_norm'),
                         ({'data.eval_batch_size': 12}, 'data.eval_batch_size'),
                         ({'data.seq_len': 32, 'model.positions': 'learned'}, 'data.seq_len'),
                         ({'data.eval_steps': 0}, 'data.eval_steps')]:
    with pytest.raises(ConfigError, match=key):
      run.run(small_config(**overrides), str(tmp_path), 'train')
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize('mode', ['train', 'eval', 'sample', 'describe'])
def test_every_mode_checks_the_config_before_reading_anything(tmp_path, mode):
  with pytest.raises(ConfigError, match='optimizer.grad_clip_norm'):
    run.run(small_config(**{'optimizer.grad_clip_norm': -1.0}), str(tmp_path), mode)
  assert not os.listdir(tmp_path)


def test_sequences_longer_than_the_learned_position_table_are_refused():
  config = load_config(ROOT / 'configs' / 'gpt_shakespeare.py')
  config.data.seq_len = config.model.max_len + 1
  with pytest.raises(ConfigError, match=rf'--config.model.max_len={config.data.seq_len}'):
    train.resolve(config)
  config.model.positions = 'rope'  # relative positions have no table to outgrow
  train.resolve(config)


def test_a_read_only_mode_drops_nothing_so_auto_keeps_the_platforms_kernel():
  """An imported GPT-2 or T5 trains at its dropout rates, which make 'auto' the reference kernel
  (it forms the probabilities it drops); eval and sample drop nothing and keep the platform's."""
  config = small_config('encoder_decoder', **{'model.dropout_rate': 0.1,
                                              'model.attention_dropout': None})
  trains = train.resolve(config, 'gpu')
  assert (trains.kernel.name, trains.model.attention_dropout_rate) == ('reference', 0.1)
  reads = train.resolve(config, 'gpu', deterministic=True)
  assert reads.kernel.name == 'cudnn'
  assert set(reads.model.dropout_rates.values()) == {0.0}


def test_the_saved_config_is_the_default_and_flags_win(tmp_path):
  trained = small_config(**{'data.name': 'text_file', 'data.path': '/some/text.txt'})
  (tmp_path / 'config.json').write_text(trained.to_json_best_effort())
  from_file = small_config()  # the --config file: synthetic data
  resolved = run.resolve_config(from_file, {'training.steps': 9}, str(tmp_path))
  assert (resolved.data.name, resolved.data.path) == ('text_file', '/some/text.txt')
  assert resolved.training.steps == 9
  assert resolved.mesh.shape == tuple(trained.mesh.shape)  # JSON lists become tuples again
  fresh = run.resolve_config(small_config(), {}, str(tmp_path / 'new'))
  assert fresh.data.name == 'synthetic'


# The config.json that small_config(family) saved before each family had its own settings: the
# model section holds all 38 settings of every family. The parameter counts are those that code
# gave these models.
EVERY_FAMILYS_SETTINGS = ROOT / 'tests' / 'fixtures' / 'configs'


@pytest.mark.parametrize('family,parameters', [
    ('decoder', 26720), ('encoder', 28224), ('encoder_decoder', 60416), ('vit', 27364)])
def test_a_saved_config_of_every_familys_settings_loads_as_its_family(tmp_path, family,
                                                                       parameters):
  saved = (EVERY_FAMILYS_SETTINGS / f'{family}.json').read_text()
  assert len(json.loads(saved)['model']) == 38
  (tmp_path / 'config.json').write_text(saved)
  config = config_lib.base_config()  # a decoder's section, replaced by the saved family's
  assert not config_lib.assign(config, config_lib.saved_config(str(tmp_path)))
  cfg = models.model_config(config.model)
  assert cfg == models.model_config(small_config(family).model).on('cpu')  # dtype 'auto' then
  assert accounting.counted_params(cfg)['total'] == parameters


def test_a_saved_setting_of_another_family_off_its_default_is_refused(tmp_path):
  saved = json.loads((EVERY_FAMILYS_SETTINGS / 'decoder.json').read_text())
  saved['model']['patch_size'] = 8
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  with pytest.raises(ConfigError, match=r"\['patch_size'\] for family 'decoder'"):
    config_lib.saved_config(str(tmp_path))


def test_a_flag_naming_another_familys_setting_fails():
  config = load_config(LLAMA)
  config.lock()  # as --config flags see it
  with pytest.raises(AttributeError, match='"patch_size" does not exist'):
    config.model.patch_size = 8


def launch(*flags, cwd=ROOT):
  env = process_env()
  return subprocess.run([sys.executable, str(ROOT / 'launch.py'), *flags], capture_output=True,
                        text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize('flags,expected', [
    (['--config.model.num_layer=6'],
     'Unknown config key \'num_layer\' in --config.model.num_layer. Did you mean "num_layers"'),
    (['--config.optimizer.learning_rate=nan'], 'optimizer.learning_rate=nan must be a finite'),
    (['--config.training.steps=abc'], 'flag --config.training.steps=abc'),
    (['--config.data.download=False', '--config.data.tfds_data_dir=/nonexistent',
      '--workdir=/tmp/transformer_jax_no_data'], 'Provide it by one of'),
], ids=['typo', 'nan', 'not a number', 'missing data'])
def test_launch_prints_a_users_mistake_as_its_message_alone(flags, expected):
  mode = [] if any(f.startswith('--workdir') for f in flags) else ['--mode=describe']
  result = launch(f'--config={LLAMA}', *mode, *flags)
  assert result.returncode == 1
  assert 'Traceback' not in result.stderr
  assert expected in result.stderr, result.stderr
  if 'Provide' not in expected:  # the data's message is a list of ways to provide it
    assert result.stderr.strip().splitlines()[-1].startswith(expected.split(' ')[0])


def keys_of(section) -> str:
  return ', '.join(sorted(section.keys()))


LLAMA_CONFIG = load_config(LLAMA)
SECTIONS = 'compile, data, eval, lora, mesh, model, optimizer, sample, training'
# (flags, the line for the last one): each unknown key is named by its own flag, as typed.
UNKNOWN = [
    (['--config.data.name=text_file', '--config.training.name=muon'],
     "Unknown config key 'name' in --config.training.name. The keys of training are "
     f'{keys_of(LLAMA_CONFIG.training)}.'),
    (['--config.training.num_steps=abc'],
     'Unknown config key \'num_steps\' in --config.training.num_steps. Did you mean "steps" or '
     '"grad_accum_steps"?'),
    (['--config.training.steps=5', '--noconfig.data.downlod'],
     'Unknown config key \'downlod\' in --noconfig.data.downlod. Did you mean "download"?'),
    (['--config.adapter.rank=4'],
     f"Unknown config section 'adapter' in --config.adapter.rank. The sections are {SECTIONS}."),
    (['--config.optimzer.learning_rate=1e-3'],
     'Unknown config section \'optimzer\' in --config.optimzer.learning_rate. Did you mean '
     f'"optimizer"? The sections are {SECTIONS}.'),
    (['--config.model.lora.rank=4'],
     "Unknown config section 'lora' in --config.model.lora.rank. model has no sections."),
    (['--config.sed=1'], 'Unknown config key \'sed\' in --config.sed. Did you mean "seed"?'),
    (['--config.workdir=/tmp/run'],
     f"Unknown config key 'workdir' in --config.workdir. The keys are {keys_of(LLAMA_CONFIG)}."),
    (['--config.model.width.x=3'],
     "Unknown config key 'x' in --config.model.width.x: model.width is a value, not a section."),
]


@pytest.mark.parametrize('flags,line', UNKNOWN, ids=[f[-1] for f, _ in UNKNOWN])
def test_an_unknown_key_is_named_by_its_flag_with_the_nearest_keys(flags, line):
  assert config_lib.unknown_keys(LLAMA_CONFIG, ['launch.py', *flags]) == [line]


def test_keys_the_config_has_pass_with_any_flag_syntax():
  flags = ['--config.data.name', 'text_file', '--noconfig.data.download', '-config.seed=3',
           '--config.mesh.shape[0]=1', '--config.model={}', '--workdir=/tmp/run']
  assert config_lib.unknown_keys(LLAMA_CONFIG, ['launch.py', *flags]) == []


@pytest.mark.parametrize('flags', [
    ['--config.data.name=text_file', '--config.training.name=muon'],
    ['--config.training.name=muon', '--config.data.name=text_file'],
], ids=['after', 'before'])
def test_launch_names_the_flag_of_an_unknown_key_whichever_flag_shares_its_name(flags):
  result = launch(f'--config={LLAMA}', '--mode=describe', *flags, '--config.adapter.rank=4')
  assert result.returncode == 1
  assert result.stderr.splitlines() == [UNKNOWN[0][1], UNKNOWN[3][1]]  # one line each, no traceback


def test_launch_names_a_config_file_that_is_not_there(tmp_path):
  result = launch(f'--config={tmp_path / "gpt.py"}', '--mode=describe')
  assert result.returncode == 1
  assert result.stderr == f'--config={tmp_path / "gpt.py"}: there is no such file.\n'


@pytest.mark.slow
def test_eval_on_a_workdir_reads_its_saved_data_location(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_text('to be or not to be, that is the question. ' * 400)
  workdir = tmp_path / 'run'
  config = f'--config={ROOT / "tests" / "train_helpers.py"}:decoder'
  trained = launch(config, f'--workdir={workdir}', '--config.data.name=text_file',
                   f'--config.data.path={text}', '--config.training.steps=2',
                   '--config.training.eval_every=2', '--config.mesh.shape=(1,)')
  assert trained.returncode == 0, trained.stderr
  logged = [row for row in metrics.read_metrics(workdir) if 'eval_loss' in row]
  evaluated = launch(config, f'--workdir={workdir}', '--mode=eval')  # no data flags
  assert evaluated.returncode == 0, evaluated.stderr
  assert f"'eval_loss': {logged[-1]['eval_loss']}" in evaluated.stderr


def test_each_section_is_resolved_once_into_its_typed_settings():
  config = config_lib.base_config('decoder')
  config.training.steps = 7
  config.mesh.shape = (-1, 2)
  config.mesh.axes = ('data', 'model')
  training = settings.TrainingSettings.of(config.training)
  assert (training.steps, training.eval_every, training.device_memory_gb) == (7, 500, None)
  assert settings.MeshSettings.of(config.mesh) == settings.MeshSettings(('data', 'model'), (-1, 2))
  # The config's sections are made from the settings: a field added there is a key here.
  assert set(config.training) == set(settings.TrainingSettings.defaults())
  assert set(config.data) == set(data.DataSettings.section_defaults())
  with pytest.raises(ValueError, match=r"Unknown training settings \['stpes'\]"):
    settings.TrainingSettings.of({'stpes': 3})
