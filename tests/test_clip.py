"""The dual-encoder family (models.clip) and its image-text data (data.image_text): sizes equal
to transformers' CLIP and SigLIP, pooling at the first EOS, the contrastive loss of the global
batch as summed terms, weight decay, bad input, and training through the run."""
import json
import os
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from transformer_jax import accounting, config_lib, convert, data, models, run, train
from transformer_jax.data import image_text, preprocess
from transformer_jax.errors import ConfigError
from transformer_jax.layers.mlp import ACTIVATIONS
from transformer_jax.models import clip
from transformer_jax.settings import OptimizerSettings
from transformer_jax.train import optim

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLIP_B32, SIGLIP_B16 = 151_277_313, 203_155_970  # transformers' CLIPModel, SiglipModel


def tiny(**overrides):
  values = dict(family='clip', width=24, num_layers=1, num_heads=2, image_size=12, patch_size=6,
                text_width=16, text_layers=1, text_heads=2, vocab_size=20, max_len=7, eos_id=3,
                embed_dim=8, dtype='float32')
  return models.model_config({**values, **overrides})


def config_model(name):
  return config_lib.from_file(ROOT / 'configs' / f'{name}.py').model


@pytest.mark.parametrize('name, expected', [('clip_b32', CLIP_B32), ('siglip_b16', SIGLIP_B16)])
def test_the_configs_have_transformers_parameter_counts(name, expected):
  model = config_model(name)
  tree = accounting.count_params(models.abstract_variables(model)['params'])
  assert accounting.param_counts(model) == tree and tree['total'] == expected


@pytest.mark.slow
def test_the_pinned_counts_are_transformers():
  torch, transformers = pytest.importorskip('torch'), pytest.importorskip('transformers')
  siglip = transformers.SiglipConfig(
      text_config=dict(vocab_size=32000, max_position_embeddings=64),
      vision_config=dict(image_size=224, patch_size=16))
  with torch.device('meta'):
    counts = [sum(p.numel() for p in model.parameters())
              for model in (transformers.CLIPModel(transformers.CLIPConfig()),
                            transformers.SiglipModel(siglip))]
  assert counts == [CLIP_B32, SIGLIP_B16]


def test_quick_gelu_is_x_sigmoid_1702x():
  x = np.linspace(-4, 4, 9, dtype=np.float32)
  np.testing.assert_allclose(ACTIVATIONS['quick_gelu'](x), x / (1 + np.exp(-1.702 * x)),
                             rtol=1e-6)


def test_the_text_tower_pools_at_the_first_eos_whatever_the_padding():
  cfg = tiny()
  tower = clip.TextTower(cfg.text_config, causal=True, pool='eos', eos_id=3)
  # Padding 0 after the EOS in row 0; row 1 pads with EOS ids (as OpenAI's tokenizer does).
  tokens = jnp.array([[1, 5, 6, 3, 0, 0, 0], [1, 7, 3, 3, 3, 3, 3]])
  params = jax.jit(tower.init)(jax.random.key(0), tokens)
  pooled = jax.jit(tower.apply)(params, tokens)
  # Causal, the output at a position is that of the prefix ending there.
  prefixes = [jax.jit(tower.apply)(params, tokens[i:i + 1, :end + 1])
              for i, end in ((0, 3), (1, 2))]
  np.testing.assert_allclose(pooled, np.concatenate(prefixes), rtol=1e-5, atol=1e-6)
  last = jax.jit(clip.TextTower(cfg.text_config, causal=False, pool='last').apply)(params, tokens)
  assert not np.allclose(last, pooled)


@pytest.mark.parametrize('loss', ['softmax', 'sigmoid'])
def test_logits_and_loss_are_the_contrastive_loss_of_the_embeddings(loss):
  cfg = tiny(loss=loss)
  model = clip.ClipModel(cfg)
  images = jax.random.normal(jax.random.key(1), (4, 12, 12, 3))
  tokens = jax.random.randint(jax.random.key(2), (4, 7), 4, 20).at[:, 5].set(3)

  @jax.jit
  def outputs(rng):
    params = model.init(rng, images, tokens)
    apply = lambda *args, **kw: model.apply(params, *args, **kw)
    sums = clip.contrastive_sums(apply, {'image': images, 'text': tokens}, None, 0.0)
    return (apply(images, method='embed_images'), apply(tokens, method='embed_texts'), sums,
            apply(images, tokens))

  image, text, sums, logits = outputs(jax.random.key(0))
  scalars = cfg.contrastive.initial_scalars()
  expected, metrics = cfg.contrastive.loss_fn()(image, text, **scalars)
  np.testing.assert_allclose(sums['loss'], 4 * expected, rtol=1e-6)
  assert sums['weight'] == 4 and sums['correct'] == 4 * metrics['image_to_text_accuracy']
  np.testing.assert_allclose(sums['temperature'] / 4, np.exp(scalars['log_temperature']),
                             rtol=1e-6)
  normed = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  cosines = normed(np.asarray(image)) @ normed(np.asarray(text)).T
  np.testing.assert_allclose(logits, np.exp(scalars['log_temperature']) * cosines
                             + scalars.get('bias', 0.0), rtol=1e-5, atol=1e-5)


def init(cfg):
  return nn.meta.unbox(jax.jit(models.build(cfg).init)(
      jax.random.key(0), *models.example_inputs(cfg))['params'])


def test_the_initial_temperature_and_bias_are_the_papers_and_settings():
  params = init(tiny(loss='sigmoid'))
  assert float(params['log_temperature']) == pytest.approx(np.log(10.0))
  assert float(params['bias']) == -10.0
  params = init(tiny())
  assert float(params['log_temperature']) == pytest.approx(np.log(1 / 0.07))
  assert 'bias' not in params
  lit = init(tiny(loss='sigmoid', temperature=10.0, bias=-2.71))
  assert float(lit['bias']) == pytest.approx(-2.71)


def test_weight_decay_takes_the_kernels_only():
  params = init(tiny(loss='sigmoid', image_pool='map'))
  mask = optim.decay_mask(params, OptimizerSettings())
  assert not mask['log_temperature'] and not mask['bias']
  assert mask['image_projection']['kernel'] and mask['image']['map_head']['attn']['query'][
      'kernel']
  # Embeddings inside a tower follow optimizer.decay_embeddings as those at the top do.
  assert all(decays == (path.endswith('kernel') and 'patch_embed' not in path)
             for path, decays in flat(mask).items()), flat(mask)


def flat(tree) -> dict:
  return {'/'.join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def open_clip_excludes(name: str, param) -> bool:
  """open_clip's rule for the parameters without weight decay (open_clip_train/main.py of
  open-clip-torch 3.3.0, verbatim)."""
  return (param.ndim < 2 or 'bn' in name or 'ln' in name or 'bias' in name
          or 'logit_scale' in name)


def test_an_imported_clip_decays_the_weights_open_clip_decays_name_by_name(tmp_path):
  """open_clip's rule on transformers' names of the same tensors (the rule reads dimensions and
  the substrings bn, ln, bias and logit_scale, which transformers' names hold where open_clip's
  do: biases end in .bias, gains are 1-D in both): the class embedding (1-D), the norms, the
  biases and the temperature are not decayed; every matrix, the position, token and patch
  embeddings included, is."""
  pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf = hf_clip(transformers)[0]
  hf.save_pretrained(tmp_path)
  config = config_lib.from_file(ROOT / 'configs' / 'from_hf.py', f'path={tmp_path}')
  cfg = models.model_config(config.model)
  params = nn.meta.unbox(models.abstract_variables(cfg)['params'])
  ours = flat(optim.decay_mask(params, OptimizerSettings.of(config.optimizer)))
  hf_params = dict(hf.named_parameters())
  expected = {path: not open_clip_excludes(spec.name, hf_params[spec.name])
              for spec in convert.ARCHITECTURES['CLIPModel'].tensors(cfg) for path in spec.paths}
  assert ours == expected
  assert not expected['image/cls_token'] and expected['image/pos_embed']
  assert expected['text/embed/positions'] and not expected['log_temperature']


def after_one_step(config, tmp_path, log_temperature) -> float:
  """t after one train step from the config's initial parameters with t = `log_temperature`."""
  from train_helpers import started
  run_, state = started(config, tmp_path)
  t = jax.device_put(jnp.float32(log_temperature), state.params['log_temperature'].sharding)
  state = state.replace(params={**state.params, 'log_temperature': t})
  state, _ = run_.train_step(state, run_.data.train_batch(0))
  return float(state.params['log_temperature'])


def test_a_clip_temperature_past_100_is_clamped_back_after_the_update(tmp_path):
  """open_clip clamps logit_scale to [0, ln 100] after each optimizer step (its gradient there
  is not zero: test_contrastive); SigLIP's t is left free, as big_vision leaves it: the update
  moves it (AdamW moves no parameter whose gradient is zero)."""
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  config.model.update(num_layers=1, text_layers=1)
  start = np.log(100.0) + 1.0
  assert after_one_step(config, tmp_path / 'clip', start) == np.float32(np.log(100.0))
  config.model.loss = 'sigmoid'
  assert 0 < abs(after_one_step(config, tmp_path / 'siglip', start) - start) < 1e-3


@pytest.mark.parametrize('overrides, fix', [
    ({'embed_dim': 0}, 'set model.embed_dim'),
    ({'bias': -10.0}, 'model.loss="sigmoid"'),
    ({'text_heads': 3}, 'model.text_heads=3 does not divide'),
    ({'temperature': 200.0}, r'model.temperature=200.0: the softmax loss keeps it in \[1, 100'),
])
def test_bad_settings_are_one_line_naming_the_fix(overrides, fix):
  with pytest.raises(ConfigError, match=fix):
    tiny(**overrides)


def make_pairs(settings, **sizes):
  return data.make_data(settings, 'image_text', seed=0, process_index=0, process_count=1,
                        **sizes)


def test_generated_pairs_caption_their_class():
  settings = {'name': 'synthetic', 'batch_size': 8, 'eval_examples': 16, 'caption_classes': 4}
  pairs = make_pairs(settings, image_size=16, text_len=40)
  batch = pairs.train_batch(3)
  assert batch['image'].shape == (8, 16, 16, 3) and batch['text'].shape == (8, 40)
  vocab = pairs.vocab
  for ids, label in zip(batch['text'], batch['label']):
    caption = vocab.decode(ids)
    assert caption in [t.format(image_text.CLASS_NAMES[label]) for t in image_text.TEMPLATES]
    ends = list(ids).index(vocab.eos_id)
    assert ids[0] == vocab.bos_id and (ids[ends + 1:] == vocab.pad_id).all()
  again = make_pairs(settings, image_size=16, text_len=40).train_batch(3)
  assert all((batch[k] == again[k]).all() for k in batch)
  assert pairs.info['eos_id'] == vocab.eos_id != vocab.pad_id


def test_a_batch_through_open_clips_crop_is_a_function_of_seed_and_step():
  """A CLIP's training pp (configs/clip_b32.py's at 16 pixels) draws its boxes as every
  augmentation here does: the same (seed, step), the same batch."""
  specs = convert.image_processor.specs(convert.clip.PROCESSOR, None, 16, 'DIR')
  settings = {'name': 'synthetic', 'batch_size': 8, 'eval_examples': 16, 'caption_classes': 4,
              'pp_train': specs[0], 'pp_eval': specs[1]}
  pairs = make_pairs(settings, image_size=16, text_len=40)
  batch = pairs.train_batch(3)
  again = make_pairs(settings, image_size=16, text_len=40).train_batch(3)
  np.testing.assert_array_equal(batch['image'], again['image'])
  assert batch['image'].dtype == np.float32 and batch['image'].shape == (8, 16, 16, 3)


def test_a_long_caption_is_cut_or_refused():
  vocab = data.Vocab.seq2seq('abc ')
  cut = image_text.encode_captions(['abcabc', 'ab'], vocab, 5, truncate=True)
  np.testing.assert_array_equal(cut, [[1, 3, 4, 5, 2], [1, 3, 4, 2, 0]])
  with pytest.raises(ConfigError, match='set data.truncate_captions=True or raise model.max_len'):
    image_text.encode_captions(['abcabc'], vocab, 5, truncate=False)


def test_jsonl_records_of_image_files(tmp_path):
  colours = {'red': (255, 0, 0), 'blue': (0, 0, 255)}
  lines = []
  for i in range(20):
    name = list(colours)[i % 2]
    Image.new('RGB', (20, 20), colours[name]).save(tmp_path / f'{i}.png')
    lines.append(json.dumps({'image': f'{i}.png', 'text': f'a {name} square'}))
  (tmp_path / 'pairs.jsonl').write_text('\n'.join(lines))
  settings = {'name': 'jsonl', 'path': str(tmp_path / 'pairs.jsonl'), 'batch_size': 2,
              'augment': False}
  pairs = make_pairs(settings, image_size=8, text_len=16)
  held_out = pairs.task.eval_examples(np.array([0, 1]))  # records 0 and 10: both red
  assert [pairs.vocab.decode(ids) for ids in held_out['text']] == ['a red square'] * 2
  red = held_out['image'][0]
  assert red.shape == (8, 8, 3) and red[..., 0].min() == 1.0 and red[..., 2].max() == -1.0
  assert pairs.info['num_train_examples'] == 18


@pytest.mark.slow
def test_training_runs_through_the_run_and_evaluates(tmp_path, monkeypatch):
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  config.model.update(num_layers=1, text_layers=1)
  workdir = str(tmp_path / 'run')
  run.run(config, workdir, 'train')
  rows = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  losses = [row['loss'] for row in rows if 'loss' in row]
  # A batch of 16 starts near the loss of chance, log 16.
  assert len(losses) == 2 and abs(losses[0] - np.log(16)) < 0.5
  assert np.isfinite(rows[-1]['eval_loss']) and 0 <= rows[-1]['eval_accuracy'] <= 1

  # --mode=export writes the run's held-out preprocessing (the generated images' statistics)
  # beside the weights (this model's EOS, the character vocabulary's 2, is one CLIPModel
  # reads otherwise: test_hf_dual_encoders_import_and_export... exports through convert.save).
  saved = {}
  monkeypatch.setattr(convert, 'save', lambda path, model, params, **kw: saved.update(kw))
  run.run(config, workdir, 'export')
  assert saved['image_preprocessing'].startswith(
      'decode|resize_small(32)|central_crop(32)|normalize(')


def hf_clip(transformers):
  """A CLIPModel of odd widths and patches of 5, and captions padded with 0 after the first EOS
  (5; the last row has another 5 later), with their attention mask."""
  config = transformers.CLIPConfig(
      text_config=dict(hidden_size=18, num_hidden_layers=2, num_attention_heads=3,
                       intermediate_size=37, vocab_size=23, max_position_embeddings=9,
                       eos_token_id=5, pad_token_id=0, bos_token_id=1),
      vision_config=dict(hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                         intermediate_size=41, image_size=15, patch_size=5),
      projection_dim=7, logit_scale_init_value=2.0)
  tokens = np.array([[1, 7, 8, 5, 0, 0, 0, 0, 0], [1, 9, 10, 11, 12, 5, 0, 0, 0],
                     [1, 13, 5, 14, 5, 0, 0, 0, 0]], np.int32)
  return transformers.CLIPModel(config), tokens, {'attention_mask': tokens != 0}


def hf_siglip(transformers):
  """A SiglipModel of odd widths and patches of 5, and captions padded to the text positions
  with the pad id and no attention mask, as SigLIP's processor gives them."""
  config = transformers.SiglipConfig(
      text_config=dict(hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                       intermediate_size=37, vocab_size=23, max_position_embeddings=9,
                       eos_token_id=2, pad_token_id=1, bos_token_id=None),
      vision_config=dict(hidden_size=30, num_hidden_layers=2, num_attention_heads=5,
                         intermediate_size=41, image_size=15, patch_size=5))
  model = transformers.SiglipModel(config)
  # A scale and bias of their own (transformers' init zeroes both).
  model.logit_scale.data.fill_(1.5)
  model.logit_bias.data.fill_(-2.5)
  tokens = np.array([[7, 8, 2, 1, 1, 1, 1, 1, 1], [9, 10, 11, 12, 13, 14, 2, 1, 1],
                     [13, 2, 1, 1, 1, 1, 1, 1, 1]], np.int32)
  return model, tokens, {}


@pytest.mark.parametrize('make', [hf_clip, hf_siglip])
def test_hf_dual_encoders_import_and_export_with_transformers_logits(make, tmp_path):
  torch, transformers = pytest.importorskip('torch'), pytest.importorskip('transformers')
  torch.manual_seed(0)
  hf, tokens, masks = make(transformers)
  hf.eval().save_pretrained(tmp_path / 'hf')
  # Its image processor at its image size, the shorter side resized a little larger first.
  processor = (transformers.CLIPImageProcessor(size={'shortest_edge': 17}, crop_size=15)
               if make is hf_clip else
               transformers.SiglipImageProcessor(size={'height': 15, 'width': 15}))
  processor.save_pretrained(tmp_path / 'hf')
  # Through configs/from_hf.py, as `launch.py --config configs/from_hf.py:path=DIR` reads it.
  config = config_lib.from_file(ROOT / 'configs' / 'from_hf.py', f'path={tmp_path / "hf"}')
  config.model.dtype = 'float32'
  picture = np.random.default_rng(1).integers(0, 256, (21, 34, 3), np.uint8)
  pixels = lambda processor: processor(picture, return_tensors='np')['pixel_values'][0]
  fed = preprocess.build(config.data.pp_eval)(picture, None).transpose(2, 0, 1)
  np.testing.assert_allclose(fed, pixels(processor), atol=2e-6)  # test_image_processor's
  cfg = train.resolve(config, 'cpu').model
  params = convert.load_params(tmp_path / 'hf', cfg)
  images = np.random.default_rng(0).normal(size=(3, 15, 15, 3)).astype(np.float32)
  ours = jax.jit(clip.ClipModel(cfg).apply)({'params': params}, images, tokens)
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(tokens).long(),
                pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)),
                **{k: torch.from_numpy(v.astype(np.int64)) for k, v in masks.items()})
  np.testing.assert_allclose(ours, theirs.logits_per_image.numpy(), atol=1e-4, rtol=1e-4)
  assert accounting.param_counts(cfg)['total'] == sum(p.numel() for p in hf.parameters())
  # What --mode=export writes (run.export: convert.save) loads back in transformers unchanged.
  convert.save(tmp_path / 'ours', cfg, params, image_preprocessing=config.data.pp_eval)
  back = type(hf).from_pretrained(tmp_path / 'ours').state_dict()
  assert back.keys() == hf.state_dict().keys()
  for name, value in hf.state_dict().items():
    np.testing.assert_array_equal(back[name].numpy(), value.numpy(), err_msg=name)
  np.testing.assert_array_equal(
      pixels(type(processor).from_pretrained(tmp_path / 'ours')), pixels(processor))


@pytest.mark.parametrize('text, vision, fix', [
    ({'hidden_size': 32}, {'hidden_size': 48}, 'text_config.hidden_size=32'),
    ({'projection_size': 16}, {}, 'text_config.projection_size=16'),
    ({}, {'vision_use_head': False}, 'vision_use_head=False'),
    ({'hidden_act': 'gelu'}, {}, "vision_config.hidden_act='gelu_pytorch_tanh'"),
    ({'attention_dropout': 0.1}, {},
     'text_config.attention_dropout=0.1, vision_config.attention_dropout=0.0'),
])
def test_a_siglip_checkpoint_we_cannot_express_fails_naming_the_option(text, vision, fix):
  with pytest.raises(convert.CheckpointError, match=fix):
    convert.model_config_of({'architectures': ['SiglipModel'], 'text_config': text,
                             'vision_config': vision})


@pytest.mark.parametrize('key, value, fix', [
    ('parallelism', 'shard_map', '--config.parallelism=jit'),
    ('training.grad_accum_steps', 2, '--config.training.grad_accum_steps=1'),
])
def test_a_loss_over_the_whole_batch_refuses_steps_that_split_it(key, value, fix):
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  section, _, name = key.rpartition('.')
  (config[section] if section else config)[name] = value
  with pytest.raises(ConfigError, match=fix):
    train.resolve(config, 'cpu')
