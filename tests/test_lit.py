"""LiT (Zhai et al. 2022): a dual encoder's tower started from a ViT run's checkpoint, a Hugging
Face ViT directory or a BERT (BertModel) directory, and a locked tower: no gradient, no optimizer
state, parameters unchanged."""
import pathlib
import re

import flax.linen as nn
import jax
import numpy as np
import pytest

from helpers import init
from train_helpers import small_config, started
from transformer_jax import config_lib, convert, models, train
from transformer_jax.data import image_text, tokenizer
from transformer_jax.models import clip
from transformer_jax.errors import ConfigError
from transformer_jax.train import losses, towers

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The image tower of train_helpers' ViT: 8x8 images in patches of 4, width 32, 2 blocks.
VIT_TOWER = dict(width=32, num_layers=2, num_heads=4, image_size=8, patch_size=4, norm_eps=1e-6,
                 mlp='gelu', pre_norm=False, patch_bias=True, image_pool='cls')
# A text tower BERT (a BertModel of width 30, 3 heads, 2 layers) starts: post-LN blocks, a norm
# of the embeddings, token types, [CLS] pooled, padding hidden.
BERT_TOWER = dict(text_width=30, text_layers=2, text_heads=3, text_d_ff=44,
                  text_norm_position='post', text_norm_eps=1e-12, text_mlp='gelu',
                  text_embed_norm=True, text_type_vocab_size=2, text_pool='first',
                  text_causal=False, text_pad_id=0, eos_id=None)


def lit_config(**model):
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  config.model.update(**VIT_TOWER, text_width=32, text_layers=1, text_heads=4, embed_dim=16)
  config.model.update(**model)
  config.optimizer.learning_rate = 1e-2
  return config


@pytest.fixture(scope='module')
def vit_run(tmp_path_factory):
  """(workdir, trained parameters) of a 2-step ViT run."""
  workdir = tmp_path_factory.mktemp('vit')
  trained = train.train(small_config('vit', steps=2), str(workdir))
  return str(workdir), jax.device_get(trained.params)


def float_sizes(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree) if np.issubdtype(x.dtype, np.floating))


def test_a_locked_tower_has_no_gradient_no_optimizer_state_and_does_not_move(tmp_path):
  run_, state = started(lit_config(lock_image=True), tmp_path)
  params = jax.device_get(state.params)
  others = {name: tree for name, tree in params.items() if name != 'image'}
  # AdamW's two moments of every parameter outside the locked tower, none of it.
  assert float_sizes(state.opt_state) == 2 * float_sizes(others)
  _, unlocked = started(lit_config(), tmp_path / 'unlocked')
  assert float_sizes(unlocked.opt_state) == 2 * float_sizes(params)
  batch = jax.device_put(run_.data.train_batch(0))
  grads = jax.device_get(jax.grad(lambda p: losses.batch_sums(
      run_.model, run_.family, p, batch, jax.random.key(0), deterministic=True,
      label_smoothing=0.0)['loss'])(state.params))
  assert not any(np.any(g) for g in jax.tree.leaves(grads['image']))
  assert all(np.any(g) for g in jax.tree.leaves(grads['text']))
  for step in range(3):
    state, _ = run_.train_step(state, jax.device_put(run_.data.train_batch(step)))
  after = jax.device_get(state.params)
  jax.tree.map(np.testing.assert_array_equal, after['image'], params['image'])
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after['text']),
                                                    jax.tree.leaves(params['text']))]
  assert all(moved) and not np.array_equal(after['image_projection']['kernel'],
                                           params['image_projection']['kernel'])


def without_head(params):
  return {name: tree for name, tree in params.items() if name != 'head'}


def test_the_image_tower_starts_from_a_vit_run_or_a_hf_vit(vit_run, tmp_path):
  workdir, trained = vit_run
  vit = small_config('vit').model
  convert.save(tmp_path / 'hf', {**vit, 'num_classes': 4}, trained)
  for source in (workdir, f'{workdir}:2', str(tmp_path / 'hf')):
    run_, state = started(lit_config(image_init=source, lock_image=True),
                          tmp_path / source.replace('/', '_'))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params['image']),
                 without_head(trained))
  # The rest is the run's own initialization, as without a start.
  _, fresh = started(lit_config(), tmp_path / 'fresh')
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params['text']),
               jax.device_get(fresh.params['text']))


@pytest.mark.parametrize('model, fix', [
    ({'width': 48}, 'has width=32 where the tower has 48: set model.width=32'),
    ({'pre_norm': True}, 'lacks pre_norm/'),
    ({'mlp': 'quick_gelu'}, "has mlp='gelu' where the tower has 'quick_gelu': set model.mlp"),
    ({'image_pool': 'map'}, 'lacks map_head/'),
])
def test_a_tower_that_does_not_fit_its_source_is_one_line_naming_the_fix(vit_run, model, fix,
                                                                        tmp_path):
  with pytest.raises(ConfigError, match=fix) as error:
    started(lit_config(image_init=vit_run[0], **model), tmp_path)
  assert '\n' not in str(error.value)


def test_a_text_tower_starts_from_a_dual_encoder_with_longer_positions(tmp_path):
  """A SigLIP directory's text tower, its position table of 12 rows cut to the tower's 7 (the
  source itself runs 7-token captions on its first 7 rows)."""
  siglip = dict(family='clip', width=24, num_layers=1, num_heads=2, image_size=12, patch_size=6,
                image_pool='map', pre_norm=False, patch_bias=True, mlp='gelu_tanh',
                text_width=24, text_layers=1, text_heads=2, vocab_size=20, text_causal=False,
                text_pool='last', text_head=True, embed_dim=0, loss='sigmoid', dtype='float32')
  source = models.model_config({**siglip, 'max_len': 12})
  source_params = init(source, jax.random.key(1))
  convert.save(tmp_path / 'siglip', source, source_params)
  cfg = models.model_config({**siglip, 'max_len': 7})
  params = towers.started(init(cfg, jax.random.key(2)), {'text': str(tmp_path / 'siglip')}, cfg)
  theirs = source_params['text']
  expected = {**theirs, 'embed': {**theirs['embed'],
                                  'positions': theirs['embed']['positions'][:7]}}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params['text']), expected)


@pytest.fixture(scope='module')
def bert_dir(tmp_path_factory):
  """A transformers BertModel of random weights, saved with the WordPiece tokenizer.json of its
  vocabulary: the generated captions' words, and BERT's special tokens first ([PAD] is 0)."""
  import torch
  import transformers
  path = tmp_path_factory.mktemp('bert')
  words = {word for template in image_text.TEMPLATES for word in re.findall(r'\w+|\.', template)}
  specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  vocab = specials + sorted(words | set(image_text.CLASS_NAMES))
  transformers.BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(
      path)
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=30,
      num_hidden_layers=2, num_attention_heads=3, intermediate_size=44,
      max_position_embeddings=40)).save_pretrained(path)
  return path


def test_the_text_tower_starts_from_a_bert_and_computes_its_cls_state(bert_dir, tmp_path):
  """The tower's pooled output before the projection is BertModel's last hidden state at [CLS]
  for the same padded captions, tokenized by its tokenizer.json as the image-text data does."""
  import torch
  import transformers
  captions = ['a photo of a goat.', 'my harp.', 'a blurry photo of the cloud.']
  vocab = tokenizer.HFTokenizer.from_file(bert_dir)
  tokens = image_text.encode_captions(captions, vocab, 12, truncate=True)
  hf_tokens = transformers.BertTokenizer.from_pretrained(bert_dir)(
      captions, padding='max_length', max_length=12, return_tensors='np')
  np.testing.assert_array_equal(tokens, hf_tokens['input_ids'])
  cfg = models.model_config(dict(  # the image tower's GELU is tanh's, the BERT's exact
      family='clip', width=24, num_layers=1, num_heads=2, image_size=12, patch_size=6,
      mlp='gelu_tanh', **BERT_TOWER, vocab_size=vocab.size, max_len=12, embed_dim=8,
      dtype='float32'))
  # The rest of the model is never read: its shapes stand in for it.
  shapes = nn.meta.unbox(models.abstract_variables(cfg)['params'])
  assert sum(x.size for x in jax.tree.leaves(shapes)) == clip.param_counts(cfg)['total']
  params = towers.started(shapes, {'text': str(bert_dir)}, cfg)
  pooled = jax.jit(lambda text, tokens: models.build(cfg).apply(
      {'params': {**params, 'text': text}}, tokens, method=lambda m, t: m.text(t)))(
          params['text'], tokens)
  bert = transformers.BertModel.from_pretrained(bert_dir).eval()
  with torch.no_grad():
    expected = bert(**{k: torch.from_numpy(v) for k, v in hf_tokens.items()}).last_hidden_state
  np.testing.assert_allclose(pooled, expected[:, 0].numpy(), atol=1e-4)
  with pytest.raises(convert.CheckpointError, match='bare BertModel, without the head'):
    convert.load(bert_dir)  # a whole model needs its head
  # Neither CLIPModel nor SiglipModel has BERT's ends.
  with pytest.raises(convert.CheckpointError,
                     match="model.text_norm_position='post' where CLIPModel has None"):
    convert.save(tmp_path, cfg, params)


def test_a_locked_bert_tower_trains_on_captions_of_its_tokenizer(bert_dir, tmp_path):
  config = lit_config(**BERT_TOWER, text_init=str(bert_dir), lock_text=True, max_len=40,
                      vocab_size=tokenizer.HFTokenizer.from_file(bert_dir).size, num_layers=1)
  config.data.tokenizer = str(bert_dir)
  run_, state = started(config, tmp_path)
  bert = jax.device_get(state.params['text'])
  others = {name: tree for name, tree in jax.device_get(state.params).items() if name != 'text'}
  assert float_sizes(state.opt_state) == 2 * float_sizes(others)
  jax.tree.map(np.testing.assert_array_equal, bert,
               convert.load_params(bert_dir, head=False))
  batch = run_.data.train_batch(0)
  cls_id, pad_id = (tokenizer.HFTokenizer.from_file(bert_dir).id_of(t) for t in ('[CLS]', '[PAD]'))
  assert np.all(batch['text'][:, 0] == cls_id) and np.any(batch['text'] == pad_id)
  for step in range(2):
    state, _ = run_.train_step(state, jax.device_put(run_.data.train_batch(step)))
  after = jax.device_get(state.params)
  jax.tree.map(np.testing.assert_array_equal, after['text'], bert)
  assert not np.array_equal(after['text_projection']['kernel'], others['text_projection']['kernel'])


@pytest.mark.parametrize('model, fix', [
    ({'text_width': 33}, 'has width=30 where the tower has 33: set model.text_width=30'),
    ({'text_layers': 1}, 'has num_layers=2 where the tower has 1: set model.text_layers=2'),
    ({'text_norm_position': None}, "has norm_position='post' where the tower has 'pre': set "
                                   "model.text_norm_position='post'"),
    ({'text_embed_norm': False}, 'has embed_norm=True where the tower has False: set '
                                 'model.text_embed_norm=True'),
    ({'text_mlp': None, 'mlp': 'gelu_tanh'}, "has mlp='gelu' where the tower has 'gelu_tanh': "
                                             "set model.text_mlp='gelu'"),
    ({'vocab_size': 98}, r'where the tower has 98: set model.vocab_size=\d+ with '
                         r'data.tokenizer=\S+bert\d*, its tokenizer\.$'),
])
def test_a_bert_that_does_not_fit_the_text_tower_is_one_line_naming_the_setting(bert_dir, model,
                                                                               fix):
  cfg = models.model_config(dict(
      family='clip', width=24, num_layers=1, num_heads=2, image_size=12, patch_size=6,
      **{'vocab_size': tokenizer.HFTokenizer.from_file(bert_dir).size, **BERT_TOWER, **model},
      max_len=8, embed_dim=8, dtype='float32'))
  shapes = nn.meta.unbox(models.abstract_variables(cfg)['params'])  # all a refusal reads
  with pytest.raises(ConfigError, match=fix) as error:
    towers.started(shapes, {'text': str(bert_dir)}, cfg)
  assert '\n' not in str(error.value)
