"""GPT-2 small: |V| = 50,257, context 1024, D = 768, 12 blocks, 12 heads: 124,439,808 parameters.

Variants (`--config configs/gpt2_small.py:corpus=lm1b,tokenizer=bpe`):
  corpus     tiny_shakespeare (the default: its characters, ids 0..64 of the 50,257-row table,
             which exercises the full model at its real size), or the name of any TFDS text
             dataset prepared in --config.data.tfds_data_dir (lm1b, ...), or jsonl
             (--config.data.path=FILES, one {"text": ...} document per line). Documents are
             packed into rows of 1024 with segment ids.
  tokenizer  chars; bpe (a byte-level BPE of 50,257 ids trained on the training documents); or
             the path of GPT-2's tokenizer.json, or of a Hugging Face checkpoint directory
             holding one (the default for a corpus other than tiny_shakespeare: bpe).
  python launch.py --config configs/gpt2_small.py:corpus=jsonl,tokenizer=/ckpt/gpt2 \
      --config.data.path='corpus/*.jsonl' --workdir /tmp/gpt2
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False, corpus='tiny_shakespeare', tokenizer='')
  config = config_lib.base_config('decoder')
  config.model.update(styles.STYLES['gpt2'])
  # dtype stays 'auto': bfloat16 on TPUs and GPUs, float32 on a CPU, where bfloat16 runs slower.
  config.model.update(vocab_size=50257, width=768, num_layers=12, num_heads=12, max_len=1024)
  documents = arg.corpus != 'tiny_shakespeare'
  config.data.update(name=arg.corpus, seq_len=1024, batch_size=32, packing=documents,
                     tokenizer=arg.tokenizer or ('bpe' if documents else 'chars'))
  config.optimizer.update(learning_rate=6e-4, warmup_steps=200, min_lr_ratio=0.1)
  config.training.update(steps=5000, log_every=20, eval_every=500, checkpoint_every=500,
                         logits_chunk=128)
  return config_lib.smoke(config) if arg.smoke else config
