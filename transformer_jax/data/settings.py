"""DataSettings: every key of config.data, typed, with its default, resolved once from the config
(`DataSettings.of(config.data)`) and read by the data package as attributes."""
import dataclasses

from transformer_jax.settings import Settings

__all__ = ['DATA_DEFAULTS', 'DATA_TYPES', 'DataSettings']


@dataclasses.dataclass(frozen=True)
class DataSettings(Settings):
  """What make_data reads; a key given as None takes its default."""
  SECTION = 'data'
  # A key of pipeline.DATASETS, or the name of any TFDS image-classification, text or translation
  # dataset.
  name: str | None = None
  tfds_data_dir: str | None = None  # TFDS data dir; None: TFDS's default (TFDS_DATA_DIR or ~/...)
  manual_dir: str | None = None  # local source files to prepare a dataset from (see sources.py)
  download: bool = True  # whether a dataset that is not prepared may be downloaded
  path: str | None = None  # text_file: any UTF-8 file; jsonl: a JSONL file or a glob of them
  eval_path: str | None = None  # jsonl: the held-out documents; None: every tenth of data.path
  text_key: str = 'text'  # jsonl and TFDS text: the text feature of a record
  # TFDS translation: the languages translated from and to; None: as the config name says
  # ('de-en': de to en, 'pt_to_en': pt to en).
  source_language: str | None = None
  target_language: str | None = None
  # Held-out pairs decoded at each evaluation (config.eval says how): a translation's for
  # eval_bleu and eval_exact_match, a seq2seq task's for eval_exact_match; 0: none.
  bleu_examples: int = 256
  exact_match_examples: int = 0
  # Text: 'chars'; 'bpe', a byte-level BPE of data.vocab_size ids trained on the training
  # documents; or the path of a tokenizer.json (or of a Hugging Face checkpoint holding one).
  tokenizer: str = 'chars'
  vocab_size: int | None = None  # a trained BPE's ids; None: model.vocab_size
  packing: bool = False  # text: whole documents packed into rows, with segment ids (data.packing)
  token_dir: str | None = None  # tokenized corpora; None: $TRANSFORMER_JAX_CACHE/tokens or ~/.cache
  seq_len: int = 64  # tokens per window or packed row; source and target length of seq2seq
  batch_size: int = 128  # the GLOBAL batch, split evenly over the processes
  eval_batch_size: int | None = None  # None: batch_size
  eval_steps: int = -1  # eval batches; -1 or None: every full batch of the held-out split
  eval_examples: int = 1024  # held-out size of generated data; synthetic trains on 9x as much
  train_split: str = 'train'  # TFDS split strings of an image dataset: 'train[:98%]', ...
  eval_split: str | None = None  # None: 'test' where the dataset has one, else 'validation'
  image_key: str = 'image'  # the image and ClassLabel features of an image dataset
  label_key: str = 'label'
  # Preprocessing of each training and held-out image, a spec of ops (data.preprocess), e.g.
  # 'decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)'. None: the image
  # brought to model.image_size (resize_small + central crop), plus with `augment` a random
  # crop of the image padded by an eighth of its side and a flip, to values in [-1, 1].
  pp_train: str | None = None
  pp_eval: str | None = None
  augment: bool = True
  mixup_alpha: float = 0.0  # mixup (Zhang et al. 2018) of training images in pairs; 0: none
  cutmix_alpha: float = 0.0  # CutMix (Yun et al. 2019); 0: none
  cutmix_prob: float = 0.5  # with both: the share of pairs CutMix mixes
  mlm_probability: float = 0.15  # encoder: share of positions selected for the MLM loss
  alphabet: str = 'abcdefghijklmnopqrstuvwxyz'  # symbols of generated text and seq2seq data
  seq2seq_min_len: int = 1  # shortest source, in symbols
  seq2seq_max_len: int | None = None  # longest source; None: seq_len - 1 (the target needs its EOS)
  image_size: int = 32  # synthetic images: height and width
  num_classes: int = 10  # synthetic images: classes
  num_threads: int = 2  # grain threads assembling training batches ahead of the device
  prefetch_buffer_size: int = 4  # training batches grain keeps ready


DATA_DEFAULTS = DataSettings.defaults()
DATA_TYPES = DataSettings.placeholder_types()  # of the keys whose default is None
