"""Hugging Face checkpoints <-> ours: transformers' own (randomly initialized, never downloaded)
models give the same logits, greedy tokens and parameter counts as the converted ones; export
round-trips; and what cannot convert exactly fails, naming the tensor or the option."""
import json
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import tokenizers
import torch
import transformers
from flax import linen as nn
from flax import traverse_util

from helpers import ROOT, load_config
from train_helpers import small_config
from transformer_jax import accounting, convert, data, decode, models, run, train
from transformer_jax.train import setup

VOCAB, WIDTH = 64, 32
# Tiny models with non-default options wherever one would hide a mistake: eps of 1e-2 so that a
# misread eps moves the logits, grouped-query attention and a rope_theta of 500 for LLaMA, and
# dropout in every model (GPT-2's and BERT's by default), which eval and decoding do not apply.
SPECS = {
    'gpt2': (transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=48, n_embd=WIDTH, n_layer=2, n_head=4, n_inner=48,
        layer_norm_epsilon=1e-2, bos_token_id=None, eos_token_id=None)),
    'llama': (transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=56, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0, rms_norm_eps=1e-2,
        max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attention_dropout=0.2)),
    'vit': (transformers.ViTForImageClassification, transformers.ViTConfig(
        image_size=8, patch_size=4, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=5, layer_norm_eps=1e-2, hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.2)),
    'bert': (transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16, layer_norm_eps=1e-2)),
}
CAUSAL = ['gpt2', 'llama']


def randomize(model, seed=0):
  """Weights of order one everywhere. HF starts biases at zero, norms at one and kernels so small
  that attention is nearly uniform, which would hide a misplaced bias, norm or head. Matrices
  ~ N(0, 1/width); vectors (biases, norm scales) move by N(0, 0.2^2)."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      noise = torch.randn(p.shape, generator=generator)
      p.copy_(p + 0.2 * noise if p.ndim == 1 else noise / WIDTH ** 0.5)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """family -> (transformers model in eval mode, the directory it saved itself to), built once.
  LLaMA is saved in shards, so that its import reads model.safetensors.index.json."""
  built = {}

  def get(family):
    if family not in built:
      cls, hf_config = SPECS[family]
      torch.manual_seed(0)
      model = cls(hf_config).eval()
      randomize(model)
      path = tmp_path_factory.mktemp(family)
      model.save_pretrained(path, safe_serialization=True,
                            max_shard_size='20KB' if family == 'llama' else '50GB')
      assert (path / 'model.safetensors.index.json').is_file() == (family == 'llama')
      built[family] = model, path
    return built[family]
  return get


def example(family, seed=0):
  """(our positional args, our keyword args, transformers' keyword args) of one batch of 2."""
  rng = np.random.default_rng(seed)
  if family == 'vit':
    images = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    return (images,), {}, dict(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)))
  tokens = rng.integers(0, VOCAB, (2, 12))
  if family != 'bert':
    return (tokens,), {}, dict(input_ids=torch.from_numpy(tokens))
  types, valid = rng.integers(0, 2, (2, 12)), np.arange(12) < np.array([[12], [9]])
  return ((tokens,), dict(token_types=types, valid=valid),
          dict(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
               attention_mask=torch.from_numpy(valid.astype(np.int64))))


def hf_logits(model, family):
  with torch.no_grad():
    return model(**example(family)[2]).logits.numpy()


def our_logits(fields, params, family):
  args, kwargs, _ = example(family)
  return np.asarray(models.build(fields).apply({'params': params}, *args, **kwargs))


@pytest.mark.parametrize('family', list(SPECS))
def test_imported_model_computes_transformers_logits(checkpoint, family):
  model, path = checkpoint(family)
  fields, params = convert.load(path)
  expected = hf_logits(model, family)
  assert np.abs(expected).max() > 1  # logits of order one: a wrong tensor would show
  np.testing.assert_allclose(our_logits(fields, params, family), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize('family', list(SPECS))
def test_parameter_counts_equal_transformers(checkpoint, family):
  model, path = checkpoint(family)
  fields, params = convert.load(path)
  hf_count = sum(p.numel() for p in model.parameters())  # a tied tensor is one parameter
  assert accounting.param_counts(fields)['total'] == hf_count
  assert sum(a.size for a in flat(params).values()) == hf_count


@pytest.mark.parametrize('family', CAUSAL)
def test_greedy_generation_equals_transformers(checkpoint, family):
  model, path = checkpoint(family)
  fields, params = convert.load(path)
  prompt = np.random.default_rng(1).integers(0, VOCAB, (2, 5))
  ours = decode.generate(models.build(fields), params, jnp.asarray(prompt), max_new_tokens=32)
  with torch.no_grad():
    theirs = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones(2, 5, dtype=int),
                            max_new_tokens=32, do_sample=False, pad_token_id=0)
  np.testing.assert_array_equal(np.asarray(ours.tokens), theirs[:, 5:].numpy())


@pytest.mark.parametrize('family', list(SPECS))
def test_export_round_trips_through_transformers(checkpoint, family, tmp_path):
  model, path = checkpoint(family)
  fields, params = convert.load(path)
  convert.save(tmp_path, fields, params)
  reloaded, info = type(model).from_pretrained(tmp_path, output_loading_info=True,
                                               local_files_only=True)
  assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
  np.testing.assert_array_equal(hf_logits(reloaded.eval(), family), hf_logits(model, family))
  assert convert.load_model_config(tmp_path) == fields
  assert_same_tree(convert.load_params(tmp_path), params)


TOWER = dict(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
TOWERS = dict(text_config=dict(TOWER, vocab_size=VOCAB, max_position_embeddings=9),
              vision_config=dict(TOWER, image_size=8, patch_size=4))
# Each class's dropouts at rates other than its defaults: (a small config of the class, the rates
# in config.json as transformers reads them back (a dual encoder's in each tower), ours as
# model.dropout_rates gives them).
DROPOUTS = {
    'GPT2LMHeadModel': (SPECS['gpt2'][1], dict(embd_pdrop=0.2, resid_pdrop=0.2, attn_pdrop=0.3),
                        dict(dropout_rate=0.2, attention_dropout=0.3, mlp_dropout=0.0)),
    'LlamaForCausalLM': (SPECS['llama'][1], dict(attention_dropout=0.3),
                         dict(dropout_rate=0.0, attention_dropout=0.3, mlp_dropout=0.0)),
    'BertForMaskedLM': (SPECS['bert'][1], dict(hidden_dropout_prob=0.2,
                                               attention_probs_dropout_prob=0.3),
                        dict(dropout_rate=0.2, attention_dropout=0.3, mlp_dropout=0.0)),
    'ViTForImageClassification': (
        SPECS['vit'][1], dict(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3),
        dict(dropout_rate=0.2, attention_dropout=0.3, mlp_dropout=0.0)),
    'WhisperForConditionalGeneration': (
        transformers.WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=12, d_model=WIDTH, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_source_positions=8, max_target_positions=10),
        dict(dropout=0.2, attention_dropout=0.3, activation_dropout=0.4),
        dict(dropout_rate=0.2, attention_dropout=0.3, mlp_dropout=0.4, final_dropout=0.0)),
    'CLIPModel': (transformers.CLIPConfig(**TOWERS, projection_dim=8), dict(attention_dropout=0.3),
                  dict(dropout_rate=0.0, attention_dropout=0.3, mlp_dropout=0.0)),
    'SiglipModel': (transformers.SiglipConfig(**TOWERS), dict(attention_dropout=0.3),
                    dict(dropout_rate=0.0, attention_dropout=0.3, mlp_dropout=0.0)),
}


def parts(config) -> list:
  """The configs that hold the dropout rates: a dual encoder's two towers, else `config`."""
  return ([config.text_config, config.vision_config] if hasattr(config, 'vision_config')
          else [config])


@pytest.mark.parametrize('name', list(DROPOUTS))
def test_dropout_rates_import_as_our_settings_and_export_back(name, tmp_path):
  """config.json's dropout rates are our model's (T5's: test_t5_convert), and the export of that
  model writes them back as transformers' config class reads them. No dropout moves the eval
  logits, which the other tests compare."""
  config, rates, ours = DROPOUTS[name]
  values = dict(config.to_dict(), architectures=[name])
  for part in [values[key] for key in TOWERS if key in values] or [values]:
    part.update(rates)
  fields = convert.model_config_of(values)
  assert models.model_config(fields).dropout_rates == ours
  shapes = nn.meta.unbox(models.abstract_variables(fields)['params'])
  convert.save(tmp_path, fields, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  assert convert.load_model_config(tmp_path) == fields
  for part in parts(type(config).from_pretrained(tmp_path)):
    assert {key: getattr(part, key) for key in rates} == rates


def flat(tree):
  return traverse_util.flatten_dict(tree, sep='/')


def assert_same_tree(got, expected):
  got, expected = flat(got), flat(expected)
  assert got.keys() == expected.keys()
  for key, value in expected.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def rewrite(path, dest, config=(), tensors=lambda weights: weights):
  """A copy of checkpoint `path` in `dest`: config.json updated with `config`, the weights
  `tensors(weights)` in one model.safetensors."""
  values = json.loads((path / 'config.json').read_text()) | dict(config)
  (dest / 'config.json').write_text(json.dumps(values))
  safetensors.numpy.save_file(tensors(convert.read_tensors(path)), dest / 'model.safetensors',
                              metadata={'format': 'pt'})
  return dest


def test_checkpoints_in_older_hub_layouts_load(checkpoint, tmp_path):
  """The hub's gpt2 lacks the 'transformer.' prefix and keeps its causal-mask buffers and a copy
  of the tied head; bert-base-uncased names LayerNorms gamma and beta and keeps the pooler, the
  next-sentence head and the tied decoder; LLaMAs come in bfloat16."""
  def gpt2_hub(weights):
    hub = {name.removeprefix('transformer.'): value for name, value in weights.items()}
    return hub | {'h.0.attn.bias': np.tril(np.ones((1, 1, 48, 48), np.float32)),
                  'lm_head.weight': hub['wte.weight']}

  def bert_hub(weights):
    hub = {name.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias',
                                                                       'LayerNorm.beta'): value
           for name, value in weights.items()}
    tokens = weights['bert.embeddings.word_embeddings.weight']
    return hub | {'bert.pooler.dense.weight': np.ones((WIDTH, WIDTH), np.float32),
                  'cls.seq_relationship.bias': np.ones(2, np.float32),
                  'cls.predictions.decoder.weight': tokens,
                  'cls.predictions.decoder.bias': weights['cls.predictions.bias']}

  for family, transform in (('gpt2', gpt2_hub), ('bert', bert_hub)):
    _, path = checkpoint(family)
    dest = (tmp_path / family)
    dest.mkdir()
    assert_same_tree(convert.load_params(rewrite(path, dest, tensors=transform)),
                     convert.load_params(path))
  _, path = checkpoint('llama')
  dest = tmp_path / 'llama'
  dest.mkdir()
  to_bf16 = lambda weights: {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}
  params = convert.load_params(rewrite(path, dest, tensors=to_bf16))
  rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32)
             for k, v in flat(convert.load_params(path)).items()}
  assert_same_tree(params, traverse_util.unflatten_dict(rounded, sep='/'))


def test_load_params_takes_run_options_but_not_model_changes(checkpoint, tmp_path):
  _, path = checkpoint('llama')
  fields, params = convert.load(path)
  stacked = convert.load_params(path, dict(fields, scan_layers=True, param_dtype='bfloat16'))
  expected = models.stack_layers(params)
  assert_same_tree(stacked, jax.tree.map(lambda a: a.astype(jnp.bfloat16), expected))
  convert.save(tmp_path, dict(fields, scan_layers=True), expected)
  assert_same_tree(convert.load_params(tmp_path), params)
  with pytest.raises(convert.CheckpointError,
                     match='model.rope_base=10000.0 where config.json has 500.0'):
    convert.load_params(path, dict(fields, rope_base=10000.0))


def test_a_tensor_of_the_wrong_shape_fails_naming_it(checkpoint, tmp_path):
  _, path = checkpoint('gpt2')
  narrow = lambda weights: weights | {'transformer.h.1.mlp.c_fc.weight': np.zeros((32, 40))}
  with pytest.raises(convert.CheckpointError,
                     match=r'Tensor transformer.h.1.mlp.c_fc.weight .* has shape \(32, 40\), but '
                           r'config.json implies \(32, 48\)'):
    convert.load_params(rewrite(path, tmp_path, tensors=narrow))


@pytest.mark.parametrize('layers,message', [
    (1, r"does not use: \['transformer.h.1.attn.c_attn.bias'"),
    (3, 'has no tensor transformer.h.2.ln_1.weight'),
])
def test_weights_of_another_config_fail(checkpoint, tmp_path, layers, message):
  _, path = checkpoint('gpt2')
  with pytest.raises(convert.CheckpointError, match=message):
    convert.load_params(rewrite(path, tmp_path, config=dict(n_layer=layers)))


def test_a_tied_copy_that_differs_fails(checkpoint, tmp_path):
  _, path = checkpoint('gpt2')
  untied = lambda weights: weights | {'lm_head.weight': weights['transformer.wte.weight'] + 1}
  with pytest.raises(convert.CheckpointError,
                     match='lm_head.weight differs from transformer.wte.weight'):
    convert.load_params(rewrite(path, tmp_path, tensors=untied))


def test_pickled_weights_are_never_read(checkpoint, tmp_path):
  shutil.copy(checkpoint('gpt2')[1] / 'config.json', tmp_path)
  (tmp_path / 'pytorch_model.bin').write_bytes(b'')
  with pytest.raises(convert.CheckpointError, match='reads safetensors only'):
    convert.load(tmp_path)


def test_an_unsupported_architecture_fails_naming_the_supported_ones(checkpoint, tmp_path):
  _, path = checkpoint('gpt2')
  rewrite(path, tmp_path, config=dict(architectures=['BartForConditionalGeneration']))
  with pytest.raises(convert.CheckpointError, match=r"\['BartForConditionalGeneration'\], none of "
                     r"which converts: transformer_jax converts "
                     r"\['BertForMaskedLM', 'BertModel', 'CLIPModel', 'GPT2"):
    convert.load(tmp_path)


@pytest.mark.parametrize('family,option,message', [
    ('llama', dict(rope_parameters=dict(rope_type='llama3', rope_theta=5e5, factor=8.0)),
     "rope_parameters.rope_type='llama3'"),
    ('llama', dict(rope_parameters=None, rope_theta=5e5, rope_scaling=dict(type='linear')),
     "rope_scaling.rope_type='linear'"),
    ('llama', dict(hidden_act='gelu'), "hidden_act='gelu'"),
    ('llama', dict(mlp_bias=True), 'mlp_bias=True'),
    ('llama', dict(head_dim=16), 'head_dim=16'),
    ('gpt2', dict(activation_function='silu'), "activation_function='silu'"),
    ('gpt2', dict(scale_attn_by_inverse_layer_idx=True), 'scale_attn_by_inverse_layer_idx=True'),
    ('gpt2', dict(embd_pdrop=0.2), r'embd_pdrop=0.2, resid_pdrop=0.1, but .* one '
     'model.dropout_rate: give them one rate'),
    ('vit', dict(qkv_bias=False), 'qkv_bias=False'),
    ('vit', dict(image_size=[8, 12]), r'image_size=\(8, 12\)'),
    ('bert', dict(position_embedding_type='relative_key'),
     "position_embedding_type='relative_key'"),
])
def test_an_option_we_do_not_model_fails_naming_it(checkpoint, family, option, message):
  _, path = checkpoint(family)
  values = json.loads((path / 'config.json').read_text()) | option
  with pytest.raises(convert.CheckpointError, match=f'config.json sets {message}'):
    convert.model_config_of(values)


def test_export_fails_where_the_class_cannot_express_the_model(checkpoint, tmp_path):
  fields, params = convert.load(checkpoint('gpt2')[1])
  with pytest.raises(convert.CheckpointError, match="GPT2LMHeadModel cannot express "
                     "model.norm='rmsnorm' where GPT2LMHeadModel has 'layernorm'"):
    convert.save(tmp_path, dict(fields, norm='rmsnorm'), params)
  with pytest.raises(convert.CheckpointError, match="LlamaForCausalLM cannot express .*"
                     "model.positions='learned' where LlamaForCausalLM has 'rope'"):
    convert.save(tmp_path, fields, params, architecture='LlamaForCausalLM')
  with pytest.raises(convert.CheckpointError, match='GPT2LMHeadModel cannot express '
                     'model.mlp_dropout=0.3 where GPT2LMHeadModel has 0.0'):
    convert.save(tmp_path, dict(fields, mlp_dropout=0.3), params)


def with_word_tokenizer(path, directory, vocab_size: int, unk_token: str):
  """The checkpoint at `path` copied to `directory` with a tokenizer.json of the words w0 ..
  w{vocab_size - 1} (ids 0 ..), split at whitespace: prompts written as ids."""
  shutil.copytree(path, directory, dirs_exist_ok=True)
  words = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {f'w{i}': i for i in range(vocab_size)}, unk_token=unk_token))
  words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  words.save(str(directory / 'tokenizer.json'))


def test_from_hf_config_samples_what_transformers_generates(checkpoint, tmp_path):
  model, path = checkpoint('gpt2')
  with_word_tokenizer(path, tmp_path, VOCAB, unk_token='w0')
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={tmp_path}')
  assert config.model.to_dict() == dict(config.model.to_dict(), **convert.load_model_config(path))
  config.sample.update(prompt='w3 w14 w15 w9', max_new_tokens=8, temperature=0.0)
  (text,) = run.run(config, None, 'sample')  # what launch.py --mode=sample does, no workdir
  with torch.no_grad():
    tokens = model.generate(torch.tensor([[3, 14, 15, 9]]), attention_mask=torch.ones(1, 4),
                            max_new_tokens=8, do_sample=False, pad_token_id=0)
  assert text == ' '.join(f'w{i}' for i in tokens[0, 4:].tolist())
  (tmp_path / 'config.json').write_text(json.dumps(
      json.loads((tmp_path / 'config.json').read_text()) | dict(eos_token_id=[5, 9])))
  assert data.tokenizer.HFTokenizer.from_file(
      tmp_path, eos_id=convert.eos_token_id(tmp_path)).eos_id == 5


def test_eval_mode_starts_from_the_hugging_face_weights(checkpoint):
  model, path = checkpoint('vit')
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={path}')
  config.data.update(name='synthetic', batch_size=8,
                     eval_batch_size=8, eval_steps=2)
  result = run.run(config, None, 'eval')  # what launch.py --mode=eval does, no workdir
  losses = []
  sizes = dict(image_size=config.model.image_size, num_classes=config.model.num_classes)
  for batch in data.make_data(config.data, 'image', seed=0, **sizes).eval_batches():
    with torch.no_grad():
      logits = model(pixel_values=torch.from_numpy(batch['image'].transpose(0, 3, 1, 2))).logits
    losses.append(torch.nn.functional.cross_entropy(
        logits, torch.from_numpy(batch['label']).long(), reduction='none').numpy())
  assert result['step'] == 0
  assert result['eval_loss'] == pytest.approx(np.concatenate(losses).mean(), abs=1e-5)


@pytest.mark.slow
def test_export_of_a_run_with_a_trained_bpe_writes_its_tokenizer_beside_the_weights(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_text('the quick brown fox jumps over the lazy dog. ' * 200, encoding='utf-8')
  config = small_config(steps=1, **{'data.name': 'text_file', 'data.path': str(text),
                                    'data.tokenizer': 'bpe', 'data.vocab_size': 270,
                                    'model.vocab_size': 270})
  train.train(config, str(tmp_path / 'run'))
  path = run.run(config, str(tmp_path / 'run'), 'export')
  trained = setup.restore_trained(config, str(tmp_path / 'run'))[0].data.vocab
  exported = data.tokenizer.HFTokenizer.from_file(path)
  sentence = 'a lazy fox, over the dog'
  assert exported.encode(sentence) == trained.encode(sentence)
  assert exported.fingerprint == trained.fingerprint
