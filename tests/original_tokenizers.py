"""The tokenizer.json files of the originals, as transformers' own classes write them, built here
offline from vocabularies trained on a few texts: Whisper's (a byte-level BPE with Whisper's
special tokens; its post-processor is the class's own, set by set_prefix_tokens), T5's (a
SentencePiece unigram model, with T5's <pad> </s> <unk> and sentinels) and LLaMA's (a
SentencePiece BPE with byte fallback, adding its BOS as LLaMA's checkpoints' tokenizer_config
says). Each function returns transformers' tokenizer, read back from the directory it saved."""
import json
import pathlib

import sentencepiece
import tokenizers
import transformers
from transformers.models.whisper import tokenization_whisper

# Whisper's special tokens after <|endoftext|>, in its order: the language tokens follow
# <|startoftranscript|> in LANGUAGES' order, which WhisperTokenizer.prefix_tokens counts on.
WHISPER_SPECIALS = (['<|startoftranscript|>']
                    + [f'<|{code}|>' for code in tokenization_whisper.LANGUAGES]
                    + ['<|translate|>', '<|transcribe|>', '<|startoflm|>', '<|startofprev|>',
                       '<|nocaptions|>', '<|notimestamps|>'])


def whisper(directory, texts, language=None, task=None):
  """WhisperTokenizer of a byte-level BPE of 300 ids trained on `texts` (<|endoftext|> id 0, as
  GPT-2's is its BOS, EOS and UNK) and WHISPER_SPECIALS, its post-processor set for `language`
  and `task` (None: the class's default, <|startoftranscript|> <|notimestamps|> $A
  <|endoftext|>)."""
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=['<|endoftext|>'], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(bpe.to_str())['model']
  made = transformers.WhisperTokenizer(
      vocab=model['vocab'], merges=[tuple(merge) for merge in model['merges']],
      additional_special_tokens=WHISPER_SPECIALS, language=language, task=task)
  made.save_pretrained(directory)
  return transformers.WhisperTokenizer.from_pretrained(directory)


def _sentencepiece(directory, texts, **options) -> pathlib.Path:
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts),
                                           model_prefix=str(directory / 'spm'),
                                           minloglevel=2, hard_vocab_limit=False, **options)
  return directory / 'spm.model'


def t5(directory, texts, vocab_size=200, extra_ids=100):
  """T5Tokenizer of a SentencePiece unigram model of `vocab_size` pieces at most trained on `texts`
  (<pad> 0, </s> 1, <unk> 2, no BOS, as T5's) and `extra_ids` sentinels <extra_id_0> .. at the
  top ids, converted by transformers from the model (its spiece.model)."""
  source = pathlib.Path(directory) / 'spm'
  model = _sentencepiece(source, texts, vocab_size=vocab_size, model_type='unigram', pad_id=0,
                         eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0)
  model.rename(source / 'spiece.model')
  transformers.T5Tokenizer.from_pretrained(source, extra_ids=extra_ids).save_pretrained(directory)
  return transformers.T5Tokenizer.from_pretrained(directory)


def llama(directory, texts, vocab_size=300):
  """LlamaTokenizer of a SentencePiece BPE of `vocab_size` pieces at most, with byte fallback, on
  `texts` (<unk> 0, <s> 1, </s> 2, as LLaMA's), adding <s> before a text as LLaMA's do."""
  source = pathlib.Path(directory) / 'spm'
  model = _sentencepiece(source, texts, vocab_size=vocab_size, model_type='bpe', unk_id=0,
                         bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True,
                         character_coverage=1.0)
  model.rename(source / 'tokenizer.model')
  transformers.LlamaTokenizer.from_pretrained(source, add_bos_token=True).save_pretrained(
      directory)
  return transformers.LlamaTokenizer.from_pretrained(directory)
