"""T5ForConditionalGeneration checkpoints <-> ours, T5 1.0 and 1.1: transformers' own models
(small, randomly initialized, never downloaded) give the same logits over padded inputs, greedy
tokens and parameter counts as the converted ones, exports load in transformers, and how the
head is tied and scaled follows the checkpoint as transformers reads it."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from helpers import ROOT, load_config
from test_convert import assert_same_tree, flat, with_word_tokenizer
from train_helpers import small_config
from transformer_jax import accounting, convert, decode, models, run, train
from transformer_jax.models import styles
from transformer_jax.train import setup

VOCAB, WIDTH, SOURCE, TARGET = 45, 21, 14, 6
# Odd widths (d_model 21, 3 heads of 5, d_ff 27), decoders deeper than encoders, an eps of
# 1e-2 (a misread eps moves the logits), and relative buckets and distances other than T5's
# 32 and 128, shorter than the inputs, so that distances past max_distance share a bucket.
SIZES = dict(vocab_size=VOCAB, d_model=WIDTH, d_kv=5, d_ff=27, num_layers=2, num_decoder_layers=3,
             num_heads=3, layer_norm_epsilon=1e-2, decoder_start_token_id=0, pad_token_id=0,
             eos_token_id=None)
STYLES = {
    # T5 1.0: ReLU, the head tied to the embedding, the decoder's output scaled by d_model^-0.5.
    't5': dict(feed_forward_proj='relu', tie_word_embeddings=True,
               relative_attention_num_buckets=7, relative_attention_max_distance=9),
    # T5 1.1 as the hub holds it: gated GELU, an lm_head.weight of its own, no scaling.
    't5_v1_1': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False,
                    relative_attention_num_buckets=12, relative_attention_max_distance=10),
    # T5 1.1 as transformers 5 saves it: the head tied to the embedding, still unscaled.
    't5_v1_1_tied': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False,
                         relative_attention_num_buckets=12, relative_attention_max_distance=10),
}
HEADS = {'t5': (True, True), 't5_v1_1': (False, False), 't5_v1_1_tied': (True, False)}


def randomize(model, seed=0):
  """Weights of order one: the embedding ~ N(0, 1) as T5 initializes it, other matrices
  ~ N(0, 1/width), norm scales 1 + N(0, 0.2^2). HF's T5 starts its relative bias tables and
  norms so that a misplaced table or norm would hardly show."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      std = 1.0 if name == 'shared.weight' else WIDTH ** -0.5
      p.copy_(p + 0.2 * noise if p.ndim == 1 else noise * std)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """style -> (transformers model in eval mode, the directory it was loaded from), built once.
  T5 1.1's untied head is written into the checkpoint beside the embedding (transformers 5
  saves T5's head tied), and the reference model is transformers' reading of that directory."""
  built = {}

  def get(style):
    if style not in built:
      torch.manual_seed(0)
      model = transformers.T5ForConditionalGeneration(
          transformers.T5Config(**SIZES, **STYLES[style])).eval()
      randomize(model)
      path = tmp_path_factory.mktemp(style)
      model.save_pretrained(path, safe_serialization=True)
      if style == 't5_v1_1':
        weights = safetensors.numpy.load_file(path / 'model.safetensors')
        head = np.random.default_rng(1).standard_normal((VOCAB, WIDTH)).astype(np.float32)
        safetensors.numpy.save_file(weights | {'lm_head.weight': head * WIDTH ** -0.5},
                                    path / 'model.safetensors', metadata={'format': 'pt'})
        model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
      built[style] = model, path
    return built[style]
  return get


def example(seed=0):
  """A batch of 2: encoder inputs (the second padded after 9 tokens), their valid positions and
  decoder inputs."""
  rng = np.random.default_rng(seed)
  inputs, targets = rng.integers(2, VOCAB, (2, SOURCE)), rng.integers(0, VOCAB, (2, TARGET))
  valid = np.arange(SOURCE) < np.array([[SOURCE], [9]])
  return np.where(valid, inputs, 0), valid, targets


def hf_logits(model):
  inputs, valid, targets = example()
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(inputs),
                 attention_mask=torch.from_numpy(valid.astype(np.int64)),
                 decoder_input_ids=torch.from_numpy(targets)).logits.numpy()


@pytest.mark.parametrize('style', list(STYLES))
def test_imported_t5_computes_transformers_logits_over_padded_inputs(checkpoint, style):
  model, path = checkpoint(style)
  fields, params = convert.load(path)
  assert (fields['tie_embeddings'], fields['scale_tied_head']) == HEADS[style]
  assert (fields['relative_buckets'], fields['relative_max_distance']) == (
      STYLES[style]['relative_attention_num_buckets'],
      STYLES[style]['relative_attention_max_distance'])
  expected = hf_logits(model)
  assert np.abs(expected).max() > 1  # logits of order one: a wrong tensor would show
  inputs, valid, targets = example()
  ours = models.build(fields).apply({'params': params}, inputs, targets, valid)
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize('style', list(STYLES))
def test_t5_parameter_counts_equal_transformers(checkpoint, style):
  model, path = checkpoint(style)
  fields, params = convert.load(path)
  hf_count = sum(p.numel() for p in model.parameters())  # a tied tensor is one parameter
  assert accounting.param_counts(fields)['total'] == hf_count
  assert sum(a.size for a in flat(params).values()) == hf_count


@pytest.mark.parametrize('style', ['t5', 't5_v1_1'])
def test_t5_greedy_generation_equals_transformers(checkpoint, style):
  """Both decode from token 0 (T5's decoder_start_token_id) over the padded encoder inputs;
  transformers without its cache, which it sizes by the encoder's depth (num_layers), too few
  layers for a deeper decoder."""
  model, path = checkpoint(style)
  fields, params = convert.load(path)
  inputs, valid, _ = example(seed=2)
  ours = decode.generate(models.build(fields), params, jnp.zeros((2, 1), jnp.int32),
                         max_new_tokens=12, inputs=jnp.asarray(inputs),
                         input_valid=jnp.asarray(valid))
  with torch.no_grad():
    theirs = model.generate(torch.from_numpy(inputs),
                            attention_mask=torch.from_numpy(valid.astype(np.int64)),
                            max_new_tokens=12, do_sample=False, use_cache=False)
  assert theirs.shape == (2, 13)  # the start token, then 12 new ones
  np.testing.assert_array_equal(np.asarray(ours.tokens), theirs[:, 1:].numpy())


@pytest.mark.parametrize('style', list(STYLES))
def test_t5_export_round_trips_through_transformers(checkpoint, style, tmp_path):
  model, path = checkpoint(style)
  fields, params = convert.load(path)
  convert.save(tmp_path, fields, params)
  assert ('lm_head.weight' in convert.tensor_names(tmp_path)) == (style == 't5_v1_1')
  reloaded, info = transformers.T5ForConditionalGeneration.from_pretrained(
      tmp_path, output_loading_info=True, local_files_only=True)
  assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
  np.testing.assert_array_equal(hf_logits(reloaded.eval()), hf_logits(model))
  assert convert.load_model_config(tmp_path) == fields
  assert_same_tree(convert.load_params(tmp_path), params)


def rewrite(path, dest, config=(), tensors=lambda weights: weights):
  values = json.loads((path / 'config.json').read_text()) | dict(config)
  (dest / 'config.json').write_text(json.dumps(values))
  safetensors.numpy.save_file(tensors(convert.read_tensors(path)), dest / 'model.safetensors',
                              metadata={'format': 'pt'})
  return dest


def test_older_t5_layouts_load(checkpoint, tmp_path):
  """Checkpoints of transformers 3 and 4 (the hub's t5-small) hold the embedding three times
  and the tied head once more, and transformers 3's a cross-attention bias table; their configs
  have no scale_decoder_outputs."""
  model, path = checkpoint('t5')

  def older(weights):
    shared = weights['shared.weight']
    return weights | {'encoder.embed_tokens.weight': shared, 'decoder.embed_tokens.weight': shared,
                      'lm_head.weight': shared,
                      'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight':
                          np.ones((7, 3), np.float32)}

  older_config = {k: v for k, v in json.loads((path / 'config.json').read_text()).items()
                  if k != 'scale_decoder_outputs'}
  (tmp_path / 'config.json').write_text(json.dumps(older_config))
  rewrite(path, tmp_path, config=older_config, tensors=older)
  fields, params = convert.load(tmp_path)
  assert fields == convert.load_model_config(path)
  assert_same_tree(params, convert.load_params(path))
  differs = lambda weights: older(weights) | {'lm_head.weight': weights['shared.weight'] + 1}
  with pytest.raises(convert.CheckpointError, match='lm_head.weight differs from shared.weight'):
    convert.load_params(rewrite(path, tmp_path, config=older_config, tensors=differs))


@pytest.mark.parametrize('option,message', [
    (dict(feed_forward_proj='gated-silu'), "feed_forward_proj='gated-silu'"),
    (dict(feed_forward_proj='gelu'), "feed_forward_proj='gelu'"),
    (dict(is_decoder=True), 'is_decoder=True'),
])
def test_a_t5_option_we_do_not_model_fails_naming_it(checkpoint, option, message):
  _, path = checkpoint('t5')
  values = json.loads((path / 'config.json').read_text()) | option
  with pytest.raises(convert.CheckpointError, match=f'config.json sets {message}'):
    convert.model_config_of(values)


def test_t5_export_fails_for_an_mlp_t5_does_not_have(checkpoint, tmp_path):
  fields, params = convert.load(checkpoint('t5')[1])
  with pytest.raises(convert.CheckpointError, match="T5ForConditionalGeneration has no 'swiglu' "
                     "MLP: model.mlp must be one of"):
    convert.save(tmp_path, dict(fields, mlp='swiglu'), params)


def test_from_hf_config_builds_the_checkpoint_as_an_encoder_decoder(checkpoint):
  _, path = checkpoint('t5_v1_1')
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={path}')
  assert config.model.to_dict() == dict(config.model.to_dict(), **convert.load_model_config(path))
  assert config.model.family == 'encoder_decoder' and config.init_from_hf == str(path)


@pytest.mark.slow
@pytest.mark.parametrize('style', ['t5', 't5_v1_1'])
def test_export_mode_writes_a_trained_t5_that_transformers_runs(tmp_path, style):
  """--mode=export of a T5 trained one step: transformers' model of the directory gives the
  logits of the trained parameters, which the directory holds exactly. The style applies over
  the original transformer's (scaled embeddings), and the decoder's depth is left unset."""
  config = small_config('encoder_decoder', steps=1)
  config.model.update(styles.STYLES[style])
  config.model.update(width=WIDTH, num_heads=3, head_width=5, d_ff=27, relative_buckets=10,
                      relative_max_distance=12, dtype='float32')
  train.train(config, str(tmp_path))
  path = run.run(config, str(tmp_path), 'export')  # what launch.py --mode=export does
  trained_run, params, step = setup.restore_trained(config, str(tmp_path))
  assert step == 1
  assert_same_tree(convert.load_params(path), params)
  inputs, valid, targets = example()
  inputs, targets = inputs % config.model.vocab_size, targets % config.model.vocab_size
  ours = trained_run.model.apply({'params': params}, inputs, targets, valid)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(path, local_files_only=True)
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.from_numpy(inputs),
                       attention_mask=torch.from_numpy(valid.astype(np.int64)),
                       decoder_input_ids=torch.from_numpy(targets)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def test_t5_dropout_rate_imports_as_every_dropout_of_t5_and_exports_back(checkpoint, tmp_path):
  """config.json's dropout_rate 0.2 is model.dropout_rate, which the T5 style applies everywhere
  T5 drops; export writes it back, and a model that drops elsewhere at another rate is one T5's
  config cannot express. A fine-tune may load the weights at another rate."""
  _, path = checkpoint('t5')
  source = rewrite(path, tmp_path, config={'dropout_rate': 0.2})
  fields, params = convert.load(source)
  assert models.model_config(fields).dropout_rates == {
      'dropout_rate': 0.2, 'attention_dropout': 0.2, 'mlp_dropout': 0.2, 'final_dropout': 0.2}
  convert.save(tmp_path / 'export', fields, params)
  assert json.loads((tmp_path / 'export' / 'config.json').read_text())['dropout_rate'] == 0.2
  assert transformers.T5Config.from_pretrained(tmp_path / 'export').dropout_rate == 0.2
  assert_same_tree(convert.load_params(source, dict(fields, dropout_rate=0.0)), params)
  with pytest.raises(convert.CheckpointError, match='cannot express model.attention_dropout=0.0 '
                     'where T5ForConditionalGeneration has 0.2'):
    convert.save(tmp_path / 'other', dict(fields, attention_dropout=0.0), params)


def test_from_hf_samples_a_t5_without_bos_from_its_decoder_start_as_transformers(checkpoint,
                                                                                   tmp_path):
  """--mode=sample of a T5 checkpoint whose tokenizer.json has no BOS (T5's has none): the
  encoder reads the prompt and EOS (config.json's eos_token_id, 1), as T5's `tokenizer(prompt)`
  gives them, and the decoder writes from its decoder_start_token_id (0), greedy as
  transformers."""
  model, path = checkpoint('t5')
  with_word_tokenizer(path, tmp_path, VOCAB, unk_token='w2')
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={tmp_path}')
  config.sample.update(prompt='w3 w14 w15 w9 w30', max_new_tokens=8, temperature=0.0)
  (text,) = run.run(config, None, 'sample')
  with torch.no_grad():
    tokens = model.generate(torch.tensor([[3, 14, 15, 9, 30, 1]]), max_new_tokens=8,
                            do_sample=False, use_cache=False)
  assert tokens[0, 0] == 0  # transformers starts from decoder_start_token_id
  assert text == ' '.join(f'w{i}' for i in tokens[0, 1:].tolist())
