"""Every task with the originals' tokenizers, their tokenizer.json files as transformers' own
classes write them (original_tokenizers): each special token is the task's, written once, and
the ids are those of transformers' documented use of the same tokenizer (WhisperProcessor's
labels, T5's `text_target`, LLaMA's `tokenizer(text)`), or differ from them where said."""
import json

import numpy as np
import pytest
import tokenizers
import torch
import transformers
from transformers.models.whisper import modeling_whisper

import original_tokenizers
from test_translation import PAIRS, data_dir, make as make_translation, records  # noqa: F401
from test_whisper import write_folder
from transformer_jax import data, decode
from transformer_jax.data import (corpus, image_text, speech, text_to_text, token_files,
                                  tokenizer as tokenizer_lib)
from transformer_jax.decode import text as decode_text

WORDS = ('the cat sat on a mat and saw two dogs run far away into dark woods while three birds '
         'sang one song good bad movie').split()


def sentences(count, seed=0):
  generator = np.random.default_rng(seed)
  return [' '.join(generator.choice(WORDS, generator.integers(2, 12))) for _ in range(count)]


@pytest.fixture(scope='module')
def made(tmp_path_factory):
  """name -> (transformers' tokenizer, the directory of its tokenizer.json), built once."""
  built = {}
  texts = sentences(200) + [text for pair in PAIRS for text in pair]  # translation's too

  def get(name, **options):
    key = (name, *sorted(options.items()))
    if key not in built:
      directory = tmp_path_factory.mktemp(name)
      built[key] = getattr(original_tokenizers, name)(directory, texts, **options), directory
    return built[key]
  return get


def ours(directory):
  return tokenizer_lib.HFTokenizer.from_file(directory)


@pytest.mark.parametrize('name,options,first', [
    ('whisper', {}, '<|startoftranscript|>'),
    ('whisper', {'language': 'fr', 'task': 'translate'}, '<|startoftranscript|>'),
    ('t5', {}, None), ('llama', {}, '<s>')])
def test_encode_leaves_out_the_post_processors_tokens_and_keeps_its_bos(made, name, options,
                                                                        first):
  hf, directory = made(name, **options)
  tokenizer = ours(directory)
  text = 'two dogs sat on the mat'
  assert hf(text).input_ids != hf(text, add_special_tokens=False).input_ids  # it adds some
  assert tokenizer.encode(text) == hf(text, add_special_tokens=False).input_ids
  assert tokenizer.encode_batch([text, 'a cat']) == [
      hf(t, add_special_tokens=False).input_ids for t in (text, 'a cat')]
  assert tokenizer.text_bos == (None if first is None else hf.convert_tokens_to_ids(first))
  assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize('saved', [{}, {'language': 'fr', 'task': 'translate'}])
def test_whisper_batches_are_transformers_fine_tuning_labels_shifted_once(made, tmp_path, saved):
  """Whatever prefix the tokenizer.json's post-processor holds (the class's default <|startof
  transcript|> <|notimestamps|>, or another language's), the run's prompt is data.language's
  and data.whisper_task's, once, and one <|endoftext|> ends the transcript. transformers'
  recipe (WhisperProcessor's labels, its data collator dropping the leading
  <|startoftranscript|>, the model shifting the labels right by decoder_start_token_id) gives
  our targets and decoder inputs; its loss also scores the prompt's three tokens, ours not."""
  hf, directory = made('whisper', **saved)
  transcripts = ['two dogs run far away', 'the cat sat', 'three birds sang']
  write_folder(tmp_path, [(f'{i}.wav', 0.1, text) for i, text in enumerate(transcripts)])
  settings = data.DataSettings.of({'name': 'audiofolder', 'audio_dir': str(tmp_path),
                                   'tokenizer': str(directory), 'seq_len': 24,
                                   'log_mel_on': 'host', 'language': 'en',
                                   'whisper_task': 'transcribe'})
  task = speech.AudioTask(settings, seed=0, num_mels=8, num_frames=20, max_len=24)
  batch = task.eval_examples(np.array([0]))  # the held-out last row
  hf = transformers.WhisperTokenizer.from_pretrained(directory, language='en', task='transcribe')
  processor = transformers.WhisperProcessor(
      feature_extractor=transformers.WhisperFeatureExtractor(feature_size=80), tokenizer=hf)
  labels = processor(audio=np.zeros(1600, np.float32), sampling_rate=16000,
                     text=transcripts[-1])['labels']
  start = hf.convert_tokens_to_ids('<|startoftranscript|>')  # decoder_start_token_id
  assert labels[0] == start and labels.count(hf.eos_token_id) == 1
  labels = labels[1:]  # the collator's
  shifted = modeling_whisper.shift_tokens_right(torch.tensor([labels]), hf.eos_token_id, start)
  count = len(labels)
  np.testing.assert_array_equal(batch['targets'][0, :count], labels)
  np.testing.assert_array_equal(batch['decoder_inputs'][0, :count], shifted[0].numpy())
  np.testing.assert_array_equal(batch['weights'][0], [0] * 3 + [1] * (count - 3)
                                + [0] * (24 - count))
  assert task.prompt == [start] + labels[:3]


def write_documents(path, texts):
  path.write_text(''.join(json.dumps({'text': text}) + '\n' for text in texts))
  return str(path)


def test_t5_span_corruption_joins_documents_as_seqio_without_eos_between(made, tmp_path):
  """The stream is the documents' SentencePiece ids one after another (seqio's
  reduce_concat_tokens of its vocabulary's encode, which adds no EOS), with no </s> though
  T5's tokenizer.json adds one after every text; each example's inputs and targets end with
  one EOS, as seqio's span corruption ends them."""
  hf, directory = made('t5')
  train, held_out = sentences(60, seed=1), sentences(20, seed=2)
  made_data = data.make_data(
      {'name': 'jsonl', 'path': write_documents(tmp_path / 'train.jsonl', train),
       'eval_path': write_documents(tmp_path / 'held_out.jsonl', held_out),
       'tokenizer': str(directory), 'task': 'span_corruption', 'seq_len': 16, 'batch_size': 8,
       'token_dir': str(tmp_path / 'tokens')}, 'seq2seq', seed=0, process_index=0,
      process_count=1)
  pieces = original_tokenizers.sentencepiece.SentencePieceProcessor(
      model_file=str(directory / 'spm' / 'spiece.model'))
  for stream, texts in ((made_data.task.train_ids, train), (made_data.task.eval_ids, held_out)):
    np.testing.assert_array_equal(stream, np.concatenate(pieces.encode(texts)))
  assert hf.eos_token_id not in np.asarray(made_data.task.train_ids)
  batch = made_data.train_batch(0)
  for inputs, valid, targets, weights in zip(batch['inputs'], batch['input_valid'],
                                             batch['targets'], batch['weights']):
    for side in (inputs[valid], targets[weights > 0]):
      assert side[-1] == hf.eos_token_id and (side == hf.eos_token_id).sum() == 1


def tiny_t5(vocab_size):
  """A T5 whose config.json says what T5's checkpoints' do of its decoder's start."""
  return transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=vocab_size, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def test_t5_text_to_text_pairs_are_transformers_text_and_text_target(made):
  """Inputs are `tokenizer(prefix + text)`, targets `tokenizer(text_target=word)` (each ending
  in T5's </s>, once), decoder inputs T5's _shift_right of the labels (from <pad>)."""
  hf, directory = made('t5')
  texts, labels = sentences(6, seed=3), np.array([0, 1, 1, 0, 1, 0])
  task = text_to_text.ClassificationAsTextTask(
      (texts, labels), (texts, labels), ours(directory), words=['bad', 'good movie'],
      prefix='sst2 sentence: ', seq_len=24, seed=0, exact_match_examples=0)
  batch = task.eval_examples(np.arange(len(texts)))
  sources = hf(['sst2 sentence: ' + text for text in texts], padding='max_length',
               max_length=24, return_tensors='pt')
  targets = hf(text_target=[['bad', 'good movie'][label] for label in labels],
               padding='max_length', max_length=24, return_tensors='pt').input_ids
  np.testing.assert_array_equal(batch['inputs'], sources.input_ids.numpy())
  np.testing.assert_array_equal(batch['input_valid'], sources.attention_mask.numpy() > 0)
  np.testing.assert_array_equal(batch['targets'], targets.numpy())
  np.testing.assert_array_equal(batch['weights'], (targets != hf.pad_token_id).numpy())
  np.testing.assert_array_equal(batch['decoder_inputs'],
                                tiny_t5(len(hf))._shift_right(targets).numpy())


def test_t5_translation_pairs_are_transformers_text_and_text_target(made, data_dir):  # noqa: F811
  """Without a task prefix, a pair is T5's `tokenizer(source, text_target=target)`."""
  hf, directory = made('t5')
  task = make_translation(data_dir, tokenizer=str(directory), vocab_size=None,
                          bleu_examples=0).task
  batch = task.eval_examples(np.arange(8))
  for row, (english, german) in enumerate(records(data_dir)[:8]):
    pair = hf(german, text_target=english)
    for key, ids in (('inputs', pair.input_ids), ('targets', pair.labels)):
      assert batch[key][row, :len(ids)].tolist() == ids and not batch[key][row, len(ids):].any()


@pytest.mark.parametrize('name,packing', [('llama', False), ('llama', True), ('t5', False)])
def test_a_language_models_documents_are_the_tokenizers_own_then_eos(made, tmp_path, name,
                                                                     packing):
  """LLaMA's: `<s> doc </s>` each, `tokenizer(doc)` (its BOS its own) and EOS, as LLaMA's
  pre-training stream; packed, each document's next-token pairs are those of the same ids.
  T5's: `doc </s>`, the EOS once (its tokenizer.json adds one, and the corpus one)."""
  hf, directory = made(name)
  train, held_out = sentences(40, seed=4), sentences(12, seed=5)
  made_data = data.make_data(
      {'name': 'jsonl', 'path': write_documents(tmp_path / 'train.jsonl', train),
       'eval_path': write_documents(tmp_path / 'held_out.jsonl', held_out),
       'tokenizer': str(directory), 'seq_len': 64 if packing else 16, 'batch_size': 4,
       'packing': packing,
       'token_dir': str(tmp_path / 'tokens')}, 'next_token', seed=0, process_index=0,
      process_count=1)
  own = [hf(text).input_ids + ([] if name == 't5' else [hf.eos_token_id]) for text in held_out]
  if not packing:
    np.testing.assert_array_equal(made_data.task.eval_ids, np.concatenate(own))
    return
  batch = made_data.task.eval_examples(np.arange(made_data.task.num_eval_examples))
  pairs = [(inputs[segments == k].tolist(), targets[segments == k].tolist())
           for inputs, targets, segments in zip(batch['inputs'], batch['targets'],
                                                batch['segment_ids'])
           for k in range(1, segments.max() + 1)]
  assert pairs == [(ids[:-1], ids[1:]) for ids in own]


def test_the_token_files_key_holds_the_special_tokens_around_each_document(made, tmp_path):
  """Stale tokens are never read: the same corpus and tokenizer with another BOS around each
  document is another folder, and so is any folder of an older FORMAT."""
  _, directory = made('llama')
  tokenizer = ours(directory)
  texts = corpus.Corpus('c', 'train', lambda: iter(['two dogs', 'a cat']), {'v': 1})
  plain = token_files.tokenized(texts, tokenizer, tmp_path, tokenizer.eos_id)
  with_bos = token_files.tokenized(texts, tokenizer, tmp_path, tokenizer.eos_id, tokenizer.bos_id)
  assert plain.directory != with_bos.directory
  assert len(with_bos) == len(plain) + 2 and with_bos.tokens[0] == tokenizer.bos_id
  assert token_files.FORMAT == 3  # 2: the post-processor's tokens were in the files


@pytest.mark.parametrize('name,decoding', [('llama', 'decoder'), ('t5', 'encoder_decoder')])
def test_sample_modes_prompt_is_transformers_tokenizer_of_it(made, monkeypatch, name, decoding):
  """A decoder continues `tokenizer(prompt)` (LLaMA's <s> first); an encoder-decoder reads it
  (T5's </s> last) and writes from its start token."""
  hf, directory = made(name)
  seen = {}

  def generate(model, params, prompt_tokens, **options):
    seen.update(prompt=prompt_tokens.tolist(), inputs=options.get('inputs'))
    return decode.Generation(tokens=prompt_tokens, lengths=np.array([prompt_tokens.shape[1]]),
                             logits=None)

  monkeypatch.setattr(decode_text, 'generate', generate)
  model = type('Model', (), {'decoding': decoding})()
  settings = decode.SampleSettings(prompt='the cat sat', max_new_tokens=2, temperature=0.0)
  decode.sample_text(model, None, ours(directory), settings, start_ids=[0])
  expected = hf('the cat sat').input_ids
  if decoding == 'decoder':
    assert seen['prompt'] == [expected]
  else:
    assert seen['inputs'].tolist() == [expected] and seen['prompt'] == [[0]]


def test_clip_captions_are_clip_tokenizers_padded_ids(tmp_path):
  """CLIP's tokenizer.json (as transformers' CLIPTokenizer writes it): <|startoftext|> caption
  <|endoftext|>, padded with <|endoftext|>, as CLIPTokenizer pads them."""
  captions = ['a photo of a goat.', 'my harp.', 'a blurry photo of the cloud.']
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(end_of_word_suffix='</w>'))
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.train_from_iterator(captions, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=['<|startoftext|>', '<|endoftext|>'],
      end_of_word_suffix='</w>', show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(bpe.to_str())['model']
  hf = transformers.CLIPTokenizer(vocab=model['vocab'],
                                  merges=[tuple(merge) for merge in model['merges']])
  hf.save_pretrained(tmp_path)
  np.testing.assert_array_equal(
      image_text.encode_captions(captions, ours(tmp_path), 12, truncate=True),
      hf(captions, padding='max_length', max_length=12).input_ids)


@pytest.mark.parametrize('processor,first', [
    (tokenizers.processors.BertProcessing(('[SEP]', 1), ('[CLS]', 0)), 0),  # BERT's
    (tokenizers.processors.RobertaProcessing(('</s>', 3), ('<s>', 2)), 2),  # RoBERTa's, CLIP's
    (tokenizers.processors.Sequence([  # LLaMA 3's
        tokenizers.processors.ByteLevel(trim_offsets=False),
        tokenizers.processors.TemplateProcessing(single='<s> $A', special_tokens=[('<s>', 2)])]),
     2),
    (tokenizers.processors.TemplateProcessing(single='$A </s>', special_tokens=[('</s>', 3)]),
     None),  # T5's
    (None, None)])
def test_the_bos_a_tokenizer_puts_first_whatever_its_post_processor(tmp_path, processor, first):
  words = {token: i for i, token in enumerate(['[CLS]', '[SEP]', '<s>', '</s>', 'a', 'cat'])}
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token='a'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  made.add_special_tokens(['[CLS]', '[SEP]', '<s>', '</s>'])
  if processor is not None:
    made.post_processor = processor
  made.save(str(tmp_path / 'tokenizer.json'))
  tokenizer = ours(tmp_path)
  assert tokenizer.text_bos == first
  assert tokenizer.encode('a cat') == [4, 5]
