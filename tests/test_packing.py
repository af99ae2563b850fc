"""Packed batches: several documents in one row, with segment ids and positions restarting at each
document. The loss of a packed batch is the sum of its documents' losses, each computed alone and
unpacked; the packed rows are built here by hand from the documents."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import init, tiny
from transformer_jax import models
from transformer_jax.layers import segment_mask
from transformer_jax.models import styles
from transformer_jax.train import losses

SEQ_LEN = 12
# The documents of each packed row by length: padding ends every row.
ROWS = [[5, 4], [7, 3]]
TARGET_ROWS = [[3, 6], [4, 5]]  # the encoder-decoder's targets of the same documents
MASK_ID = 39


def _pack(rows):
  """rows: per row, its documents' 1-D arrays -> (values, segment ids, positions), each
  (len(rows), SEQ_LEN), padded with zeros (segment 0) at the end of every row."""
  values = np.zeros((len(rows), SEQ_LEN), rows[0][0].dtype)
  segments, positions = (np.zeros((len(rows), SEQ_LEN), np.int32) for _ in range(2))
  for r, docs in enumerate(rows):
    start = 0
    for segment, doc in enumerate(docs, 1):
      span = slice(start, start + len(doc))
      values[r, span], segments[r, span], positions[r, span] = doc, segment, np.arange(len(doc))
      start += len(doc)
  return values, segments, positions


def _documents(family):
  """Each document's own unpacked batch of one row, and their packed batch of len(ROWS) rows."""
  rng = np.random.default_rng(0)
  tokens = lambda n: rng.integers(1, MASK_ID, n).astype(np.int32)
  lengths = [n for row in ROWS for n in row]
  if family == 'decoder':
    docs = [{'inputs': tokens(n), 'targets': tokens(n), 'weights': np.ones(n, np.float32)}
            for n in lengths]
  elif family == 'encoder':
    docs = []
    for n in lengths:
      chosen = rng.random(n) < 0.4
      chosen[0] = True
      original = tokens(n)
      docs.append({'inputs': np.where(chosen, MASK_ID, original).astype(np.int32),
                   'targets': original, 'weights': chosen.astype(np.float32)})
  else:
    target_lengths = [n for row in TARGET_ROWS for n in row]
    docs = [{'inputs': tokens(n), 'decoder_inputs': tokens(m), 'targets': tokens(m),
             'weights': np.ones(m, np.float32)} for n, m in zip(lengths, target_lengths)]
  rows, start = [], 0
  for row in ROWS:
    rows.append(docs[start:start + len(row)])
    start += len(row)
  packed = {}
  for key in docs[0]:
    values, segments, positions = _pack([[doc[key] for doc in row] for row in rows])
    packed[key] = values
    if key in ('inputs', 'targets'):
      prefix = '' if family != 'encoder_decoder' else key[:-1] + '_'
      packed[f'{prefix}segment_ids'], packed[f'{prefix}positions'] = segments, positions
  unpacked = [{key: value[None] for key, value in doc.items()} for doc in docs]
  return unpacked, packed


def _loss(model, family, params, batch):
  batch = jax.tree.map(jnp.asarray, batch)
  logits, targets, weights = losses.logits_targets_weights(model, family, params, batch)
  return losses.loss_sums(logits, targets, weights)['loss']


def _without_segments(batch):
  """The packed rows read as one document each: no segment ids, positions 0..T-1."""
  return {key: value for key, value in batch.items()
          if not key.endswith(('segment_ids', 'positions'))}


MODELS = {
    'decoder_gpt2': ('decoder', styles.STYLES['gpt2']),
    'decoder_llama': ('decoder', dict(styles.STYLES['llama'], num_kv_heads=2)),
    'encoder_bert': ('encoder', styles.STYLES['bert']),
    'encoder_decoder_transformer': ('encoder_decoder', styles.of('transformer', 'encoder_decoder')),
    'encoder_decoder_llama': ('encoder_decoder', dict(styles.of('llama', 'encoder_decoder'),
                                                      num_kv_heads=2)),
}


def _model(name, kernel='auto'):
  family, settings = MODELS[name]
  cfg = tiny(family, attention_kernel=kernel, **settings)
  return cfg, models.build(cfg), models.family_of(cfg)


@pytest.mark.parametrize('name', [pytest.param(name, marks=pytest.mark.slow)
                                  if name == 'decoder_gpt2' else name for name in MODELS])
def test_packed_loss_is_the_sum_of_the_documents_losses(rng, name):
  cfg, model, family = _model(name)
  params = init(cfg, rng)
  unpacked, packed = _documents(family.name)
  expected = sum(_loss(model, family, params, doc) for doc in unpacked)
  np.testing.assert_allclose(_loss(model, family, params, packed), expected, rtol=1e-5)
  # Read as one document per row, the same rows give another loss, by ten times the tolerance
  # at least (8e-4 to 7e-3 of it for these models): the test can fail.
  crossing = _loss(model, family, params, _without_segments(packed))
  assert abs(crossing - expected) > 1e-4 * abs(expected)


# In CI's slow step: each compiles a program per document length. Every attention kernel with
# GPT-2's blocks; LLaMA's (rotary positions restarting at each document) with the CPU kernel.
@pytest.mark.slow
@pytest.mark.parametrize('name,kernel', [('decoder_gpt2', 'reference'), ('decoder_gpt2', 'xla'),
                                         ('decoder_gpt2', 'cpu'), ('decoder_llama', 'cpu')])
def test_packed_decoder_gradient_is_the_sum_of_the_documents_gradients(rng, name, kernel):
  cfg, model, family = _model(name, kernel)
  params = init(cfg, rng)
  unpacked, packed = _documents('decoder')
  loss_and_grad = jax.value_and_grad(lambda params, batch: _loss(model, family, params, batch))
  loss, grads = loss_and_grad(params, packed)
  per_document = [loss_and_grad(params, doc) for doc in unpacked]
  np.testing.assert_allclose(loss, sum(loss for loss, _ in per_document), rtol=1e-5)
  summed = jax.tree.map(lambda *grads: sum(grads), *[grads for _, grads in per_document])
  flat = lambda tree: np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(tree)])
  # Relative to the largest entry, as some are zero but for rounding (the keys' biases, which
  # the softmax cancels).
  expected = flat(summed)
  np.testing.assert_allclose(flat(grads), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_segment_mask_sees_its_own_segment_only():
  queries = jnp.array([[1, 1, 2, 0]])
  keys = jnp.array([[1, 2, 2, 0, 0]])
  expected = np.array([[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]], bool)
  mask = segment_mask(queries, keys)
  assert mask.shape == (1, 1, 4, 5)
  np.testing.assert_array_equal(mask[0, 0], expected)
