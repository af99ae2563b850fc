"""Step for step against transformers: a random-weight checkpoint that transformers writes, imported
through configs/from_hf.py, trains 20 steps here (the run's own train step and optimizer, started
as launch.py starts it) and in torch (torch.optim.AdamW under torch's own warmup and cosine
schedulers, clip_grad_norm_, weight decay on the tensors that our optimizer decays, named through
the converter's table) on the same batches, in float32 without dropout: the losses agree at
every step and the parameters at the end."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
import transformers
from flax import traverse_util

import train_helpers
from helpers import ROOT, load_config
from transformer_jax import convert, models
from transformer_jax.data import image_text
from transformer_jax.train import setup, sharding

STEPS = 20
LOSS_RTOL = 1e-4
# The parameters after training: the largest difference of an entry, and the difference of a
# tensor over the change that training made to it (Frobenius norms).
PARAM_ATOL, PARAM_RTOL = 1e-4, 1e-3
# An attention's key bias has no gradient in exact arithmetic (it adds q.b to every logit of a
# query, which the softmax removes): each side's Adam steps on its own rounding noise, so the two
# differ by up to the learning rate per step, and the model's outputs by nothing.
NO_GRADIENT = re.compile(r'attn/key/bias$')


@pytest.fixture(autouse=True)
def one_torch_thread():
  """torch on one thread: on models this small its intra-op threads cost 20 to 50 times the
  step's own CPU time, more on a loaded machine."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def imported_config(path, learning_rate, **data):
  """configs/from_hf.py:path=DIR as a float32 run of STEPS steps of warmup then cosine decay, with
  a weight decay large enough that a parameter decayed on one side only would show."""
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={path}')
  config.model.dtype = 'float32'
  config.data.update(batch_size=8, **data)
  config.optimizer.update(learning_rate=learning_rate, warmup_steps=3, min_lr_ratio=0.1,
                          weight_decay=0.5)
  config.training.update(steps=STEPS)
  return config


@dataclasses.dataclass
class Trained:
  run: setup.Run
  batches: list
  losses: list
  rates: list
  grad_norms: list
  params: dict


def train_ours(config, workdir, batches=None) -> Trained:
  """STEPS steps of the run's own jitted train step, started as launch.py starts it
  (init_from_hf's weights, a fresh optimizer), on `batches` (default: the run's data's)."""
  run_, state = train_helpers.started(config, workdir)
  batches = batches or [run_.data.train_batch(step) for step in range(STEPS)]
  losses, rates, norms = [], [], []
  for batch in batches:
    state, metrics = run_.train_step(state, sharding.global_batch(batch, run_.mesh))
    metrics = jax.device_get(metrics)
    losses.append(float(metrics['loss'] / metrics['weight']))
    rates.append(float(metrics['learning_rate']))
    norms.append(float(metrics['grad_norm']))
  return Trained(run_, batches, losses, rates, norms, jax.device_get(state.params))


def hf_decays(run_) -> dict[str, bool]:
  """{HF tensor name: whether the run's optimizer decays it}, through the converter's table of
  the parameters of ours each HF tensor holds. Decayed are the entries that the run's update of
  zero gradients moves at parameters of ones (AdamW's step of a zero gradient is exactly 0, its
  decay lr * weight_decay): the mask as the optimizer applies it, whatever decides it."""
  ones = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, leaf.dtype), run_.abstract_params)
  updates, _ = run_.tx.update(jax.tree.map(jnp.zeros_like, ones), run_.tx.init(ones), ones)
  moved = traverse_util.flatten_dict(models.unstack_layers(jax.device_get(updates)), sep='/')
  architecture = convert.directory.architecture_of(
      convert.directory.read_config(run_.settings.init_from_hf))
  decays = {}
  for spec in architecture.tensors(run_.model_config):
    (decays[spec.name],) = {bool(value) for path in spec.paths for value in moved[path].flat}
  assert any(decays.values()) and not all(decays.values())
  return decays


def torch_optimizer(model, opt, decays: dict[str, bool]):
  """torch.optim.AdamW of `opt` (the run's OptimizerSettings) over the model's trained tensors,
  with weight decay on those `decays` names, under torch's schedulers for our warmup and cosine
  decay: (step + 1) / warmup of the peak at steps 0 .. warmup - 1, then down to min_lr_ratio of
  it at step STEPS."""
  trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
  assert {name for name, _ in trained} <= decays.keys()
  groups = [{'params': [p for name, p in trained if decays[name] == decayed],
             'weight_decay': opt.weight_decay if decayed else 0.0} for decayed in (True, False)]
  optimizer = torch.optim.AdamW(groups, lr=opt.learning_rate, betas=(opt.b1, opt.b2),
                                eps=opt.eps)
  warmup, schedulers = opt.warmup_steps, torch.optim.lr_scheduler
  scheduler = schedulers.SequentialLR(optimizer, [
      schedulers.LinearLR(optimizer, 1 / warmup, 1.0, total_iters=warmup - 1),
      schedulers.CosineAnnealingLR(optimizer, STEPS - warmup,
                                   eta_min=opt.min_lr_ratio * opt.learning_rate)],
      milestones=[warmup])
  return optimizer, scheduler


def train_torch(model, run_, inputs: list[dict]) -> tuple[list, list]:
  """(losses, learning rates) of transformers' model trained with the run's optimizer settings
  on `inputs`, the keyword arguments of each step's forward pass (which returns the loss)."""
  opt = run_.settings.optimizer
  optimizer, scheduler = torch_optimizer(model, opt, hf_decays(run_))
  model.train()  # its dropout rates are all 0
  losses, rates = [], []
  for kwargs in inputs:
    rates.append(optimizer.param_groups[0]['lr'])
    optimizer.zero_grad()
    loss = model(**kwargs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip_norm)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
  return losses, rates


def assert_step_for_step(ours: Trained, theirs: tuple[list, list], model, directory):
  """The losses and learning rates agree at every step and the trained parameters (HF's read
  back through the converter) at the end; prints the largest differences measured."""
  hf_losses, hf_rates = theirs
  np.testing.assert_allclose(ours.rates, hf_rates, rtol=1e-6)
  np.testing.assert_allclose(ours.losses, hf_losses, rtol=LOSS_RTOL)
  assert ours.losses[-1] < ours.losses[0] - 0.1  # it learned: the steps were not no-ops
  model.save_pretrained(directory / 'trained')
  read = lambda path: traverse_util.flatten_dict(
      convert.load_params(path, ours.run.model_config), sep='/')
  start, theirs_params = read(ours.run.settings.init_from_hf), read(directory / 'trained')
  worst = {'loss': float(np.max(np.abs(np.array(ours.losses) / hf_losses - 1))),
           'abs': 0.0, 'of_tensor': 0.0, 'of_update': 0.0, 'no_gradient_abs': 0.0}
  for name, value in traverse_util.flatten_dict(models.unstack_layers(ours.params),
                                                sep='/').items():
    expected, update = theirs_params[name], theirs_params[name] - start[name]
    difference = float(np.abs(value - expected).max())
    if NO_GRADIENT.search(name):
      worst['no_gradient_abs'] = max(worst['no_gradient_abs'], difference)
      continue
    if not update.any():  # Whisper's fixed encoder positions, which neither side trains
      assert difference == 0, name
      continue
    of_update = float(np.linalg.norm(value - expected) / np.linalg.norm(update))
    assert difference <= PARAM_ATOL and of_update <= PARAM_RTOL, (name, difference, of_update)
    worst['abs'] = max(worst['abs'], difference)
    worst['of_tensor'] = max(worst['of_tensor'], difference / float(np.abs(expected).max()))
    worst['of_update'] = max(worst['of_update'], of_update)
  worst['clipped_steps'] = sum(norm > ours.run.settings.optimizer.grad_clip_norm
                               for norm in ours.grad_norms)
  print(f'{model.__class__.__name__}: {worst}')


# GPT-2: next-token batches of random tokens, the positions past each row's length unweighted.

def gpt2_batches(vocab, seq_len, seed=0):
  """STEPS batches cycling through 4 (so that the loss falls), in the next-token task's form."""
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(4):
    tokens = rng.integers(0, vocab, (8, seq_len + 1)).astype(np.int32)
    lengths = rng.integers(seq_len // 2, seq_len + 1, 8)
    weights = (np.arange(seq_len) < lengths[:, None]).astype(np.float32)
    batches.append({'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'weights': weights})
  return [batches[step % 4] for step in range(STEPS)]


def gpt2_inputs(batch):
  """GPT2LMHeadModel shifts its labels itself (labels[:, t + 1] scores logits[:, t]), so it
  reads the whole sequence (the logits of its last position unscored) and its labels are the
  sequence with -100 where our targets weigh 0."""
  tokens = np.concatenate([batch['inputs'], batch['targets'][:, -1:]], axis=1)
  labels = np.concatenate([batch['inputs'][:, :1],
                           np.where(batch['weights'] > 0, batch['targets'], -100)], axis=1)
  return dict(input_ids=torch.from_numpy(tokens).long(), labels=torch.from_numpy(labels).long())


def test_gpt2_trains_step_for_step_as_transformers(tmp_path):
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None))
  model.save_pretrained(tmp_path / 'hf')
  config = imported_config(tmp_path / 'hf', 1e-2, name='synthetic', seq_len=16)
  ours = train_ours(config, tmp_path / 'run', gpt2_batches(64, 16))
  theirs = train_torch(model, ours.run, [gpt2_inputs(batch) for batch in ours.batches])
  assert_step_for_step(ours, theirs, model, tmp_path)


# CLIP: the generated pairs of our image-text task, captions by a word-level tokenizer.json.

def caption_tokenizer(directory):
  """A word-level tokenizer.json of the generated captions' words, [PAD] <s> [UNK] </s> first
  (EOS 3: transformers reads a CLIP eos_token_id of 2 as the legacy pooling at the highest id)."""
  words = {word for template in image_text.TEMPLATES for name in image_text.CLASS_NAMES
           for word in tokenizers.pre_tokenizers.Whitespace().pre_tokenize_str(
               template.format(name))}
  vocab = ['[PAD]', '<s>', '[UNK]', '</s>'] + sorted(w for w, _ in words)
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {word: i for i, word in enumerate(vocab)}, unk_token='[UNK]'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  made.add_special_tokens(vocab[:4])
  made.save(str(directory / 'tokenizer.json'))
  return str(directory / 'tokenizer.json'), len(vocab)


def clip_inputs(batch):
  """CLIPModel's: NCHW pixels, and the attention mask of the captions as CLIP's processor gives
  it (0 on the padding after EOS, which our causal tower pooled at EOS never reads)."""
  tokens = torch.from_numpy(batch['text']).long()
  return dict(pixel_values=torch.from_numpy(batch['image'].transpose(0, 3, 1, 2)),
              input_ids=tokens, attention_mask=(tokens != 0).long(), return_loss=True)


def test_clip_trains_step_for_step_as_transformers(tmp_path):
  tokenizer, vocab_size = caption_tokenizer(tmp_path)
  torch.manual_seed(0)
  model = transformers.CLIPModel(transformers.CLIPConfig(
      text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, vocab_size=vocab_size, max_position_embeddings=12,
                       pad_token_id=0, bos_token_id=1, eos_token_id=3),
      vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, image_size=16, patch_size=4),
      projection_dim=16))
  model.save_pretrained(tmp_path / 'hf')
  config = imported_config(tmp_path / 'hf', 1e-3, name='synthetic', tokenizer=tokenizer)
  ours = train_ours(config, tmp_path / 'run')
  theirs = train_torch(model, ours.run, [clip_inputs(batch) for batch in ours.batches])
  assert_step_for_step(ours, theirs, model, tmp_path)


# Whisper: the generated tones of our speech task, transcripts after Whisper's decoder prompt.

WHISPER_SPECIALS = ['<|endoftext|>', '<|startoftranscript|>', '<|en|>', '<|transcribe|>',
                    '<|translate|>', '<|notimestamps|>']


def digit_tokenizer(directory):
  """A word-level tokenizer.json of Whisper's special tokens (<|endoftext|> 0,
  <|startoftranscript|> 1), [UNK] and the digits, the generated tones' transcripts."""
  vocab = WHISPER_SPECIALS + ['[UNK]'] + list('0123456789')
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {word: i for i, word in enumerate(vocab)}, unk_token='[UNK]'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  made.add_special_tokens(WHISPER_SPECIALS)
  made.save(str(directory / 'tokenizer.json'))
  return str(directory / 'tokenizer.json'), len(vocab)


def whisper_inputs(batch, hf_config):
  """WhisperForConditionalGeneration's: (mels, frames) features, our decoder inputs, and as
  labels our targets with -100 where they weigh 0 (the prompt's and the padding's). Given
  labels alone it would make its decoder inputs by shifting them right after
  decoder_start_token_id, its -100 turned into the pad id: for the prompt's it would read pads,
  so they are given, and they are what that shift makes of the unmasked targets."""
  targets = torch.from_numpy(batch['targets']).long()
  decoder_inputs = torch.from_numpy(batch['decoder_inputs']).long()
  shifted = transformers.models.whisper.modeling_whisper.shift_tokens_right(
      targets, hf_config.pad_token_id, hf_config.decoder_start_token_id)
  np.testing.assert_array_equal(shifted, decoder_inputs)
  labels = np.where(batch['weights'] > 0, batch['targets'], -100)
  return dict(input_features=torch.from_numpy(batch['features'].transpose(0, 2, 1)),
              decoder_input_ids=decoder_inputs, labels=torch.from_numpy(labels).long())


def test_whisper_trains_step_for_step_as_transformers(tmp_path):
  tokenizer, vocab_size = digit_tokenizer(tmp_path)
  hf_config = transformers.WhisperConfig(
      vocab_size=vocab_size, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
      decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, pad_token_id=0,
      bos_token_id=0, eos_token_id=0, decoder_start_token_id=1, suppress_tokens=[],
      begin_suppress_tokens=[])
  torch.manual_seed(0)
  model = transformers.WhisperForConditionalGeneration(hf_config)
  model.save_pretrained(tmp_path / 'hf')
  # The host's features (log_mel_on='host'), which transformers reads as input_features.
  config = imported_config(tmp_path / 'hf', 1e-2, name='synthetic', tokenizer=tokenizer,
                           seq_len=8, log_mel_on='host')
  ours = train_ours(config, tmp_path / 'run')
  batch = ours.batches[0]  # the prompt's 3 targets unweighted; the digit's and EOS's weighted
  assert (batch['weights'][:, :3] == 0).all() and (batch['weights'].sum(axis=1) == 2).all()
  theirs = train_torch(model, ours.run, [whisper_inputs(b, hf_config) for b in ours.batches])
  assert_step_for_step(ours, theirs, model, tmp_path)
